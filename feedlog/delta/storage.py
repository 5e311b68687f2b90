"""The one narrow I/O boundary of the Delta library (delta-kernel-rs's storage handler).

Paths are relative to the table root and use '/'. The contracts every
implementation must keep (the storage contract suite checks them):

- `list(dir, start_after)` returns the files directly in `dir` whose names sort after
  `start_after` (all if None), sorted by name, with size and modification time (ms);
  hidden names ('.' prefix: in-flight temp files) are not listed; a missing directory
  lists as empty. (`start_after` is the object stores' list-from, and spares a local
  listing a stat per old log file.) With `stat=False` an implementation may leave size and
  modification time as None, when names are all the caller needs.
- `read(path)` returns the whole file or raises NotFound.
- `put_if_absent(path, data)` creates the file with exactly `data`, atomically:
  concurrent callers for one path see exactly one True; readers never see a partial file.
  It returns False (not an exception: losing a race is a normal outcome) if the file exists.
- `write_atomic(path, data)` replaces the file all at once (readers see old or new, never a mix).
- `delete(path)` removes the file; deleting a missing file is not an error.
- `stat(path)` returns the file's size and modification time (ms) or raises NotFound.
- `walk(prune, skip)`, optional, streams every file under the table root, recursively, with size and
  modification time, in no particular order: directories for which `prune(dir)` is true are not
  entered, and a symbolic link is neither entered nor listed (what it points to is not the table's).
  `skip(dir)`, if given, names files in `dir` to pass over unlisted (a local walk need not stat
  them: vacuum's referenced files).
  Memory stays bounded by the depth of the tree (or one page of an object-store listing), not by
  the number of files. The module's `walk(storage, prune)` is Unsupported where a storage has none.
- `delete_dir(path)`, optional, removes the directory `path` if it is empty and says whether it did;
  a directory that is not empty (written to meanwhile) or missing stays, False; never the root. A
  storage without directories (an object store) has none, and the module's `delete_dir` is False.
- `read_many(paths)`, optional, is `read` of each path in order with each failure (a FeedlogError)
  returned in its place; the module's `read_many(storage, paths)` uses it where a storage has it
  (a log replay's commit files: a local directory opened once, an object store's reads in flight
  together) and reads one path after another where not.

`LocalStorage` keeps a table in a directory; `MemoryStorage` keeps one in memory, for
protocol tests that need no disk; `objectstore.ObjectStorage` keeps one on an object store (S3,
GCS, Azure, file://, memory://), and `objectstore.open_storage` turns a location into a Storage.
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import errno
import os
import threading
import uuid
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from stat import S_ISREG
from typing import NamedTuple, Protocol

from ..clock import Clock, SystemClock
from ..errors import FeedlogError, NotFound, Unavailable, Unsupported


class FileInfo(NamedTuple):
    path: str
    size: int | None
    modified_ms: int | None


class Storage(Protocol):
    def list(self, directory: str, start_after: str | None = None, stat: bool = True) -> list[FileInfo]: ...

    def read(self, path: str) -> bytes: ...

    def put_if_absent(self, path: str, data: bytes) -> bool: ...

    def write_atomic(self, path: str, data: bytes) -> None: ...

    def delete(self, path: str) -> None: ...

    def stat(self, path: str) -> FileInfo: ...

    @property
    def location(self) -> str:
        """Where the table lives, for messages and for readers we hand the table to."""
        ...


#: what `LocalStorage.read_many` asks for first: all of a typical commit file, in one read
_FIRST_READ = 1 << 16


def read_many(storage: Storage, paths: Sequence[str]) -> list[bytes | FeedlogError]:
    """`storage.read` of each path, in order, each failure (a FeedlogError) in its place: through the
    storage's own `read_many` where it has one (a local directory opened once, an object store's
    reads in parallel), else one read after another."""
    if _goes_with(type(storage), "read_many", "read"):
        return list(storage.read_many(paths))  # type: ignore[attr-defined]
    out: list[bytes | FeedlogError] = []
    for path in paths:
        try:
            out.append(storage.read(path))
        except FeedlogError as e:
            out.append(e)
    return out


def walk(
    storage: Storage,
    prune: Callable[[str], bool] | None = None,
    skip: Callable[[str], Container[str]] | None = None,
) -> Iterator[FileInfo]:
    """Every file under the table root, recursively (`walk` in the contract above); Unsupported for a
    storage that cannot list recursively."""
    method = getattr(storage, "walk", None)
    if method is None:
        raise Unsupported(f"{storage.location}: this storage cannot list the table's files recursively")
    return iter(method(prune, skip))


def delete_in(storage: Storage, directory: str, names: Iterable[str]) -> int:
    """Delete the files `names` of `directory` (a missing one is no error), through the storage's own
    `delete_in` where it has one (a local directory opened once; an object store's bulk delete), else
    one `delete` after another. The number of names taken."""
    method = getattr(storage, "delete_in", None)
    if method is not None:
        return int(method(directory, names))
    n = 0
    for name in names:
        storage.delete(f"{directory}/{name}" if directory else name)
        n += 1
    return n


def delete_dir(storage: Storage, path: str) -> bool:
    """`storage.delete_dir(path)` where the storage has directories to delete, else False."""
    method = getattr(storage, "delete_dir", None)
    return bool(method(path)) if method is not None else False


def put_new(storage: Storage, path: str, data: bytes) -> bool:
    """`storage.put_if_absent` of a file under a name no one else uses, through the storage's own
    `put_new` where it has one that goes with its `put_if_absent` (LocalStorage: written in place)."""
    if _goes_with(type(storage), "put_new", "put_if_absent"):
        return bool(storage.put_new(path, data))  # type: ignore[attr-defined]
    return storage.put_if_absent(path, data)


def _goes_with(cls: type, special: str, general: str) -> bool:
    """Whether `cls` has a `special` method that goes with its `general` one: defined by the class
    that defines `general`, or by a subclass of it (a subclass that overrides `read` or
    `put_if_absent` alone, to count or fail them, gets every call through its own method)."""
    mro = cls.__mro__
    mine = next((i for i, c in enumerate(mro) if special in vars(c)), None)
    theirs = next((i for i, c in enumerate(mro) if general in vars(c)), None)
    return mine is not None and theirs is not None and mine <= theirs


class LocalStorage:
    """A table in a local directory.

    put-if-absent writes a hidden temp file, fsyncs it and hard-links it to the
    final name: `link` fails if the name exists and makes the complete file
    visible in one step, which is the atomicity Delta's log needs.
    """

    def __init__(self, root: str | os.PathLike[str], fsync: bool = True) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.fsync = fsync

    @property
    def location(self) -> str:
        return self.root

    def _abs(self, path: str) -> str:
        return os.path.join(self.root, *path.split("/")) if path else self.root

    def _list_after(self, directory: str, prefix: str, start_after: str, stat: bool) -> list[FileInfo]:
        # A list-from (the log after a checkpoint) skips the old names in C (sort + bisect): looking
        # at each of 10,000 entries in Python cost more than reading the table's checkpoint (measured).
        where = self._abs(directory)
        try:
            names = os.listdir(where)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise Unavailable(f"cannot list {where}: {e.strerror}") from None
        names.sort()
        out = []
        for name in names[bisect.bisect_right(names, start_after) :]:
            if name.startswith("."):
                continue
            try:
                st = os.lstat(os.path.join(where, name))
            except FileNotFoundError:
                continue  # deleted since the directory was read
            except OSError as e:
                raise Unavailable(f"cannot list {where}: {e.strerror}") from None
            if not S_ISREG(st.st_mode):
                continue
            if stat:
                out.append(FileInfo(prefix + name, st.st_size, st.st_mtime_ns // 1_000_000))
            else:
                out.append(FileInfo(prefix + name, None, None))
        return out

    def list(self, directory: str, start_after: str | None = None, stat: bool = True) -> list[FileInfo]:
        prefix = f"{directory}/" if directory else ""
        if start_after is not None:
            return self._list_after(directory, prefix, start_after, stat)
        out = []
        try:
            if not stat:  # names alone (a log replay's listing): no per-entry Python beyond the tuple
                with os.scandir(self._abs(directory)) as it:
                    names = [e.name for e in it if e.name[0] != "." and e.is_file(follow_symlinks=False)]
                names.sort()
                return [FileInfo(prefix + name, None, None) for name in names]
            with os.scandir(self._abs(directory)) as it:
                for entry in it:
                    if entry.name.startswith(".") or (start_after is not None and entry.name <= start_after):
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    if not stat:
                        out.append(FileInfo(prefix + entry.name, None, None))
                        continue
                    st = entry.stat(follow_symlinks=False)
                    out.append(FileInfo(prefix + entry.name, st.st_size, st.st_mtime_ns // 1_000_000))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise Unavailable(f"cannot list {self._abs(directory)}: {e.strerror}") from None
        out.sort()
        return out

    def walk(
        self, prune: Callable[[str], bool] | None = None, skip: Callable[[str], Container[str]] | None = None
    ) -> Iterator[FileInfo]:
        """Every regular file under the root (the contract's `walk`): a depth-first scan that holds one
        open directory at a time; `lstat` data only, so a symbolic link is never followed. A skipped
        name is not statted (the directory entry's type says what it is)."""
        stack = [""]
        while stack:
            directory = stack.pop()
            prefix = f"{directory}/" if directory else ""
            passed = () if skip is None else skip(directory)
            try:
                with os.scandir(self._abs(directory)) as it:
                    for entry in it:
                        name = entry.name
                        if entry.is_dir(follow_symlinks=False):
                            if prune is None or not prune(prefix + name):
                                stack.append(prefix + name)
                        elif name not in passed and entry.is_file(follow_symlinks=False):
                            try:
                                st = entry.stat(follow_symlinks=False)
                            except FileNotFoundError:
                                continue  # deleted since the directory was read
                            yield FileInfo(prefix + name, st.st_size, st.st_mtime_ns // 1_000_000)
            except FileNotFoundError:
                continue  # removed while walking (or no table directory at all)
            except OSError as e:
                raise Unavailable(f"cannot list {self._abs(directory)}: {e.strerror}") from None

    def read_many(self, paths: Sequence[str]) -> builtins.list[bytes | FeedlogError]:
        """`read` of each path, in order, a failure (NotFound, Unavailable) in its place. Files are
        opened relative to their directory, opened once for all of them (a log replay reads
        thousands of small commit files, and walking the whole path again was a fifth of each
        read), and read without an fstat: a short read of a regular file is its end, and a log
        lists only regular files."""
        out: builtins.list[bytes | FeedlogError] = []
        dirs: dict[str, int] = {}
        try:
            for path in paths:
                directory, _, name = path.rpartition("/")
                dfd = dirs.get(directory)
                if dfd is None:
                    try:
                        dfd = os.open(self._abs(directory), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    except OSError:
                        try:
                            out.append(self.read(path))  # says what is wrong, as a lone read would
                        except FeedlogError as e:
                            out.append(e)
                        continue
                    dirs[directory] = dfd
                out.append(self._read_at(dfd, name, path))
        finally:
            for fd in dirs.values():
                os.close(fd)
        return out

    def _read_at(self, dfd: int, name: str, path: str) -> bytes | FeedlogError:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
            try:
                data = os.read(fd, _FIRST_READ)
                if len(data) < _FIRST_READ:
                    return data
                parts = [data]
                while chunk := os.read(fd, 1 << 20):
                    parts.append(chunk)
                return b"".join(parts)
            finally:
                os.close(fd)
        except (FileNotFoundError, NotADirectoryError):
            return NotFound(f"{self._abs(path)} does not exist")
        except IsADirectoryError:
            return Unavailable(f"cannot read {self._abs(path)}: it is a directory")
        except OSError as e:
            return Unavailable(f"cannot read {self._abs(path)}: {e.strerror}")

    def read(self, path: str) -> bytes:
        # os.open/fstat/read, not open(): a snapshot without a checkpoint reads every commit file,
        # and the file object's layers cost half of it (10,000 commits: ~160 ms -> ~90 ms, measured)
        full = self._abs(path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
            try:
                size = os.fstat(fd).st_size
                data = os.read(fd, size + 1)
                if len(data) <= size:
                    return data  # a short read of a regular file is its end
                parts = [data]  # grown since the fstat, or not a regular file: read to the end
                while chunk := os.read(fd, 1 << 20):
                    parts.append(chunk)
                return b"".join(parts)
            finally:
                os.close(fd)
        except (FileNotFoundError, NotADirectoryError):  # a path under a file does not exist either
            raise NotFound(f"{full} does not exist") from None
        except IsADirectoryError:
            raise Unavailable(f"cannot read {full}: it is a directory") from None
        except OSError as e:
            raise Unavailable(f"cannot read {full}: {e.strerror}") from None

    def stat(self, path: str) -> FileInfo:
        try:
            st = os.stat(self._abs(path))
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"{self._abs(path)} does not exist") from None
        except OSError as e:
            raise Unavailable(f"cannot stat {self._abs(path)}: {e.strerror}") from None
        return FileInfo(path, st.st_size, st.st_mtime_ns // 1_000_000)

    def _write_temp(self, path: str, data: bytes) -> str:
        final = self._abs(path)
        directory = os.path.dirname(final)
        tmp = os.path.join(directory, f".{os.path.basename(final)}.{uuid.uuid4().hex}.tmp")
        for attempt in range(3):
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileNotFoundError:  # the directory first (not before every write: a mkdir that
                # finds it there still locks the parent, and cost a committer as much as its fsync);
                # again if a vacuum removed it, empty, between the mkdir and the open
                if attempt == 2:
                    raise
                os.makedirs(directory, exist_ok=True)
        try:
            self._write_all(fd, data)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def _write_all(self, fd: int, data: bytes) -> None:
        """All of `data` to the open file `fd`, then fsync (when this storage syncs)."""
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if self.fsync:
            os.fsync(fd)

    def _sync_dir(self, path: str) -> None:
        if not self.fsync:
            return
        fd = os.open(os.path.dirname(self._abs(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        try:
            tmp = self._write_temp(path, data)
        except OSError as e:
            raise Unavailable(f"cannot write {self._abs(path)}: {e.strerror}") from None
        try:
            os.link(tmp, self._abs(path))
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise Unavailable(
                    f"{self.root}: this filesystem has no hard links, so put-if-absent cannot be atomic here"
                ) from None
            raise Unavailable(f"cannot write {self._abs(path)}: {e.strerror}") from None
        finally:
            os.unlink(tmp)
        self._sync_dir(path)
        return True

    def put_new(self, path: str, data: bytes) -> bool:
        """put-if-absent of a file under a name no one else writes or reads before this call returns
        (a staged commit's UUID name: the owner reads it only once told): created exclusively under
        its own name and written in place, without put_if_absent's temp file, link and unlink, so its
        directory entry goes to disk in the same journal commit as its data. False if it existed;
        a failed write removes the file."""
        final = self._abs(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os.open(final, flags, 0o644)
        except FileExistsError:
            return False
        except FileNotFoundError:  # its directory first (a dangling link there stays an error)
            try:
                os.makedirs(os.path.dirname(final), exist_ok=True)
                fd = os.open(final, flags, 0o644)
            except FileExistsError:
                return False
            except OSError as e:
                raise Unavailable(f"cannot write {final}: {e.strerror}") from None
        except OSError as e:
            raise Unavailable(f"cannot write {final}: {e.strerror}") from None
        try:
            try:
                self._write_all(fd, data)
            finally:
                os.close(fd)
            self._sync_dir(path)
        except BaseException as e:
            with contextlib.suppress(OSError):  # gone already (a cleanup took it): the error is the write's
                os.unlink(final)
            if isinstance(e, OSError):
                raise Unavailable(f"cannot write {final}: {e.strerror}") from None
            raise
        return True

    def write_atomic(self, path: str, data: bytes) -> None:
        try:
            tmp = self._write_temp(path, data)
            os.replace(tmp, self._abs(path))
            self._sync_dir(path)
        except OSError as e:
            raise Unavailable(f"cannot write {self._abs(path)}: {e.strerror}") from None

    def delete(self, path: str) -> None:
        try:
            os.unlink(self._abs(path))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise Unavailable(f"cannot delete {self._abs(path)}: {e.strerror}") from None

    def delete_in(self, directory: str, names: Iterable[str]) -> int:
        """The module's `delete_in`: unlink relative to the directory, opened once (not a path lookup
        from the root per file)."""
        where = self._abs(directory)
        n = 0
        try:
            dfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return sum(1 for _ in names)  # gone, and its files with it
        except OSError as e:
            raise Unavailable(f"cannot open {where}: {e.strerror}") from None
        try:
            for name in names:
                n += 1
                try:
                    os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise Unavailable(f"cannot delete {os.path.join(where, name)}: {e.strerror}") from None
        finally:
            os.close(dfd)
        return n

    def delete_dir(self, path: str) -> bool:
        """The contract's `delete_dir`: rmdir, which removes only an empty directory (never the root)."""
        if not path:
            return False
        try:
            os.rmdir(self._abs(path))
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False  # written to meanwhile, or never empty: it stays
            raise Unavailable(f"cannot delete {self._abs(path)}: {e.strerror}") from None
        return True


class MemoryStorage:
    """A table in memory (`memory://<name>`): the same contracts as `LocalStorage`, no disk.

    Every operation holds one lock, so each is atomic and put-if-absent has exactly one
    winner among threads. Modification times come from `clock` (the system clock by
    default), so a test with a `ManualClock` controls what time-based code (timestamp
    fallbacks, cleanup) sees. Directories exist only as prefixes of file paths, as in an
    object store; a path may not be both a file and a directory, as on a local disk.
    """

    def __init__(self, name: str = "table", clock: Clock | None = None) -> None:
        self.name = name
        self.clock: Clock = clock or SystemClock()
        self._files: dict[str, tuple[bytes, int]] = {}
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return f"memory://{self.name}"

    def _where(self, path: str) -> str:
        return f"{self.location}/{path}"

    def _check_writable(self, path: str) -> None:
        """Unavailable where a local disk would refuse: a parent that is a file, or a directory in the way."""
        if not path or path.endswith("/"):
            raise Unavailable(f"cannot write {self._where(path)}: not a file name")
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in self._files:
                raise Unavailable(f"cannot write {self._where(path)}: {'/'.join(parts[:i])} is a file")
        if any(p.startswith(path + "/") for p in self._files):
            raise Unavailable(f"cannot write {self._where(path)}: it is a directory")

    def list(self, directory: str, start_after: str | None = None, stat: bool = True) -> list[FileInfo]:
        prefix = f"{directory}/" if directory else ""
        with self._lock:
            found = [(p, data, mtime) for p, (data, mtime) in self._files.items() if p.startswith(prefix)]
        out = []
        for path, data, mtime in found:
            name = path[len(prefix) :]
            if "/" in name or name.startswith(".") or (start_after is not None and name <= start_after):
                continue
            out.append(FileInfo(path, len(data), mtime) if stat else FileInfo(path, None, None))
        out.sort()
        return out

    def walk(
        self, prune: Callable[[str], bool] | None = None, skip: Callable[[str], Container[str]] | None = None
    ) -> Iterator[FileInfo]:
        with self._lock:
            found = sorted((p, len(data), mtime) for p, (data, mtime) in self._files.items())
        for path, size, mtime in found:
            parts = path.split("/")[:-1]
            if prune is not None and any(prune("/".join(parts[: i + 1])) for i in range(len(parts))):
                continue
            if skip is not None and path.rpartition("/")[2] in skip(path.rpartition("/")[0]):
                continue
            yield FileInfo(path, size, mtime)

    def read(self, path: str) -> bytes:
        with self._lock:
            found = self._files.get(path)
        if found is None:
            raise NotFound(f"{self._where(path)} does not exist")
        return found[0]

    def stat(self, path: str) -> FileInfo:
        with self._lock:
            found = self._files.get(path)
        if found is None:
            raise NotFound(f"{self._where(path)} does not exist")
        return FileInfo(path, len(found[0]), found[1])

    def put_if_absent(self, path: str, data: bytes) -> bool:
        data = bytes(data)  # a caller's later change to a bytearray must not change the file
        with self._lock:
            if path in self._files:
                return False
            self._check_writable(path)
            self._files[path] = (data, self.clock.now_ms())
            return True

    def write_atomic(self, path: str, data: bytes) -> None:
        data = bytes(data)
        with self._lock:
            if path not in self._files:
                self._check_writable(path)
            self._files[path] = (data, self.clock.now_ms())

    def delete(self, path: str) -> None:
        with self._lock:
            self._files.pop(path, None)
