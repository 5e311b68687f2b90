"""Reading a writer's file as a service that faces strangers: confined to the table, bounded in size.

The owner reads staged commits that writers name. A name is checked by shape
elsewhere; here, on a local disk, every step of the path is opened without
following links, and only a regular file of bounded size is read, so a writer
cannot point the owner at another table, a device, a FIFO or a huge file. On an
object store there are no links or devices: the object's size is checked from
the response's metadata before its body is read (`read_staged`).
"""

from __future__ import annotations

import errno
import os
import stat

from ...errors import InvalidArgument, NotFound, Unavailable, shorten
from ..storage import LocalStorage, Storage

#: The largest staged commit the owner reads (a documented limit; larger ones are refused unread).
#: A commit of 64 MiB is ~200,000 add actions; reading without a bound let one writer make the
#: owner allocate whatever file it pointed a staged name at.
MAX_STAGED_COMMIT_BYTES = 64 << 20


def _open_dir(parent: int, name: str, where: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except FileNotFoundError:
        raise NotFound(f"{where} does not exist") from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise InvalidArgument(f"{where} is a symbolic link or not a directory") from None
        raise Unavailable(f"cannot open {where}: {e.strerror}") from None


def read_confined(table: str, directory: str, name: str, limit: int = MAX_STAGED_COMMIT_BYTES) -> bytes:
    """`table/directory/name`, read only if every step is a real directory and the file a regular
    file of at most `limit` bytes; `table` is the already-confined real path of the table.

    Each step is opened relative to the last with O_NOFOLLOW, so a symbolic link anywhere on
    the way (planted, or swapped in after the table's path was checked) is refused rather than
    followed out of the table or `--root`; O_NONBLOCK makes opening a FIFO return at once (a
    blocking open of a FIFO waits for a writer that may never come), and fstat then refuses it
    with devices and sockets. The size is checked before reading anything.
    """
    shown = shorten(f"{table}/{directory}/{name}", 300)
    parts = [p for p in table.split("/") if p] + [p for p in directory.split("/") if p]
    if any(p in (".", "..") for p in parts) or "/" in name or name in ("", ".", ".."):
        raise InvalidArgument(f"{shown} is not a plain path")
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            nfd = _open_dir(fd, part, shorten("/" + "/".join(parts[: i + 1]), 300))
            os.close(fd)
            fd = nfd
        try:
            ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            raise NotFound(f"{shown} does not exist") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise InvalidArgument(f"{shown} is a symbolic link, not a regular file") from None
            raise Unavailable(f"cannot open {shown}: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        st = os.fstat(ffd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"{shown} is not a regular file")
        if st.st_size > limit:
            raise InvalidArgument(f"{shown} is larger than the {limit}-byte limit ({st.st_size} bytes)")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(ffd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while we read
            raise InvalidArgument(f"{shown} is larger than the {limit}-byte limit")
        return b"".join(chunks)
    except OSError as e:
        raise Unavailable(f"cannot read {shown}: {e.strerror}") from None
    finally:
        os.close(ffd)


def read_staged(storage: Storage, directory: str, name: str, limit: int = MAX_STAGED_COMMIT_BYTES) -> bytes:
    """`directory/name` of the table in `storage`, read confined (`read_confined` on a local disk) and
    only if at most `limit` bytes: on an object store the size is known before the body is read."""
    if "/" in name or name in ("", ".", ".."):
        raise InvalidArgument(f"{shorten(name)!r} is not a plain file name")
    if isinstance(storage, LocalStorage):
        return read_confined(storage.root, directory, name, limit)
    path = f"{directory}/{name}"
    bounded = getattr(storage, "read_bounded", None)
    if bounded is not None:
        return bytes(bounded(path, limit))
    data = storage.read(path)  # an in-memory store: the bytes are already in memory
    if len(data) > limit:
        raise InvalidArgument(f"{storage.location}/{path} is larger than the {limit}-byte limit ({len(data)} bytes)")
    return data
