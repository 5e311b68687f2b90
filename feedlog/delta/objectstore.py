"""Tables on object stores (S3, GCS, Azure, file://, memory://) through obstore, and `open_storage`.

obstore is the Python binding of the Rust `object_store` crate, the one delta-rs uses, so a
URL and `storage_options` that work with delta-rs work here unchanged: the options are the
same keys (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_ALLOW_HTTP`, `AZURE_STORAGE_ACCOUNT_NAME`,
`GOOGLE_SERVICE_ACCOUNT`, ...), upper or lower case, and the usual environment variables fill
in whatever the options leave out.

The storage contract (storage.py) on an object store:

- `put_if_absent` is a conditional create (`If-None-Match: *`); the store answers a second
  create of one name with 412, which is `False` here. A store without conditional put (S3
  with `AWS_CONDITIONAL_PUT=disabled`, an S3-compatible endpoint that ignores the header) cannot
  decide a filesystem commit race: writing a commit file there raises `Unsupported` naming
  managed commits, never a silent last-writer-wins. The first `put_if_absent` on each storage
  checks the store really refuses a second create (a hidden probe object, deleted after).
- `write_atomic` is a plain put: an object appears whole or not at all.
- `list` is a delimited listing (direct children only), or a listing from `start_after`
  (S3's start-after) with nested names dropped; hidden names are skipped.

S3 credentials: without keys (or another source object_store knows) object_store asks the instance
metadata service, and it ignores AWS_EC2_METADATA_DISABLED; feedlog honours that switch (as the AWS
SDKs and delta-rs do) by refusing such a store at once with PermissionDenied. AWS_PROFILE, which
delta-rs reads and object_store does not, is refused as an option rather than silently ignored.
"""

from __future__ import annotations

import builtins
import os
import re
import threading
import uuid
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
    UnknownConfigurationKeyError,
)
from obstore.store import MemoryStore, ObjectStore, from_url

from ..errors import FeedlogError, InvalidArgument, NotFound, PermissionDenied, Unavailable, Unsupported
from .storage import FileInfo, LocalStorage, Storage

#: the URL schemes ObjectStorage serves (obstore's names for the same stores included)
OBJECT_SCHEMES = frozenset({"s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure", "file", "memory"})

#: delta-rs options that configure the HTTP client, not the store (after the AWS_/AZURE_/GOOGLE_ prefix)
_CLIENT_KEYS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "http1_only",
        "http2_only",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "timeout",
        "user_agent",
    }
)
#: delta-rs options about its own commit machinery (locking, unsafe rename), meaningless here
_DELTA_RS_ONLY = frozenset(
    {
        "aws_s3_allow_unsafe_rename",
        "aws_s3_locking_provider",
        "delta_dynamo_table_name",
        "dynamo_lock_table_name",
        "aws_force_credential_load",
        "mount_allow_unsafe_rename",
    }
)
_RETRY_KEYS = frozenset({"max_retries", "retry_timeout"})
#: where object_store finds S3 credentials before it asks the instance metadata service (IMDS):
#: config keys or AWS_* environment variables, named here without the aws_ prefix
_S3_CREDENTIAL_KEYS = frozenset(
    {
        "access_key_id",
        "secret_access_key",
        "web_identity_token_file",
        "container_credentials_relative_uri",
        "container_credentials_full_uri",
    }
)
_NO_CREDENTIALS = (
    "no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment or as storage options"
)
#: what to set when a store found no credentials and its instance-metadata fallback failed, by scheme
_CREDENTIAL_HINTS = {
    "gs": "GOOGLE_SERVICE_ACCOUNT (a service account key file) or GOOGLE_APPLICATION_CREDENTIALS",
    "az": "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY or AZURE_CLIENT_ID with AZURE_CLIENT_SECRET",
}
#: object_store's requests for credentials: AWS IMDS, the GCP and Azure metadata token endpoints, OAuth
_CREDENTIAL_REQUEST = re.compile(r"/latest/api/token|/latest/meta-data|169\.254\.169\.254|token request")
_COMMIT_FILE = re.compile(r"(^|/)_delta_log/\d{20}\.json$", re.ASCII)

_memory_lock = threading.Lock()
_memory_stores: dict[str, MemoryStore] = {}


def _memory_store(name: str) -> MemoryStore:
    """One MemoryStore per `memory://name` in a process, so opening a URL twice finds one table."""
    with _memory_lock:
        store = _memory_stores.get(name)
        if store is None:
            store = _memory_stores[name] = MemoryStore()
        return store


def scheme_of(location: str) -> str | None:
    """The URL scheme of `location` ('s3'), or None for a plain path (Windows drive letters included)."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", location)
    if m is None or (len(m.group(1)) == 1 and os.name == "nt"):
        return None
    return m.group(1).lower()


def open_storage(location: Storage | str | os.PathLike[str], options: Mapping[str, str] | None = None) -> Storage:
    """The Storage for `location`: a path is a LocalStorage (the embedded default), a URL with a
    scheme in OBJECT_SCHEMES an ObjectStorage; a Storage is returned as it is. Any other URL
    (`foo://x`, `s3:x`) is InvalidArgument, never taken as a local path."""
    if not isinstance(location, (str, os.PathLike)):
        if options:
            raise InvalidArgument("storage options apply to a location URL, not to a Storage object")
        return location
    text = os.fspath(location)
    scheme = scheme_of(text)
    if scheme is None:
        if options:
            raise InvalidArgument(f"storage options apply to object-store URLs, not to the local path {text}")
        return LocalStorage(text)
    if scheme not in OBJECT_SCHEMES:
        raise InvalidArgument(
            f"unsupported storage URL scheme {scheme!r} in {text}: use a local path or one of "
            "s3://, gs://, az://, abfss://, file://, memory://"
        )
    if not text[len(scheme) + 1 :].startswith("//"):
        raise InvalidArgument(f"bad storage URL {text}: expected {scheme}://...")
    return ObjectStorage(text, options)


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def _split_options(scheme: str, options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """delta-rs storage_options -> obstore's (store config, client options, retry config)."""
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    retry: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for key, value in options.items():
        k = key.lower()
        if k in seen:
            raise InvalidArgument(f"storage option {key} given twice (as {seen[k]} and {key})")
        seen[k] = key
        bare = re.sub(r"^(aws_|azure_|google_)", "", k)
        if k in _DELTA_RS_ONLY or k == "aws_ec2_metadata_disabled":  # the latter: see _check_s3_credentials
            continue
        if k == "aws_profile":
            raise InvalidArgument(
                f"storage option {key}: AWS profiles are not read here (object_store has no profiles); give "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) as storage options or "
                "in the environment"
            )
        if bare in _CLIENT_KEYS:
            client[bare] = value
        elif k in _RETRY_KEYS:
            try:
                retry[k] = int(value) if k == "max_retries" else timedelta(seconds=float(value.rstrip("s")))
            except ValueError:
                raise InvalidArgument(f"storage option {key}={value!r}: expected a number") from None
        elif scheme == "memory":
            raise InvalidArgument(f"storage option {key} does not apply to memory:// tables")
        else:
            config[key.upper() if k.startswith(("aws_", "azure_", "google_")) else k] = value
    return config, client, retry


def _check_s3_credentials(url: str, options: Mapping[str, str]) -> None:
    """PermissionDenied, before any request, for an S3 store with no credentials while instance metadata
    is turned off (AWS_EC2_METADATA_DISABLED=true, an option or the variable: the AWS SDKs' and
    delta-rs's switch). object_store ignores that switch and would ask http://169.254.169.254 anyway,
    which off EC2 can take ~13 s of retries to give up where the address is silently dropped."""
    given = {re.sub(r"^aws_", "", k.lower()): v for k, v in options.items()}
    env = {k[len("AWS_") :].lower(): v for k, v in os.environ.items() if k.startswith("AWS_") and v}
    disabled = given.get("ec2_metadata_disabled", env.get("ec2_metadata_disabled"))
    if not _truthy(disabled):
        return
    if _truthy(given.get("skip_signature", env.get("skip_signature"))):  # a public bucket: no credentials
        return
    if _S3_CREDENTIAL_KEYS & {k for k, v in given.items() if v} or _S3_CREDENTIAL_KEYS & env.keys():
        return
    off = "; instance metadata is off: AWS_EC2_METADATA_DISABLED)"
    raise PermissionDenied(f"cannot open {url}: {_NO_CREDENTIALS}{off}")


def _option_named(options: Mapping[str, str], error: str) -> str | None:
    """The option whose value an obstore configuration error quotes ('failed to parse "x" as ...')."""
    for key, value in options.items():
        if value and f'"{value}"' in error:
            return key
    return None


def _store_said(text: str) -> str | None:
    """What the store's own error answer says: S3 and Azure answer `<Error><Code>..</Code><Message>..`
    in XML, which object_store quotes after the status line ('403 Forbidden: <?xml ...'); a body-less
    answer (HEAD) leaves only the status. None if the store gave no answer (a connection error)."""
    code = re.search(r"<Code>([^<]{1,100})</Code>", text)
    if code is not None:
        message = re.search(r"<Message>([^<]{1,300})</Message>", text)
        return f"{code.group(1)}: {message.group(1).strip()}" if message else code.group(1)
    status = re.search(r"status code: (\d{3} [A-Za-z ]{1,40}?)(:|$)", text.split("\n", 1)[0])
    return status.group(1) if status else None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


#: whether a store honours If-None-Match, by (scheme, bucket or root, options): probing costs three
#: requests, and a process opens many table handles on one store
_CONDITIONAL_PUT: dict[tuple[str, str, tuple[tuple[str, str], ...]], bool] = {}
_PROBE_LOCK = threading.Lock()


#: object-store reads in flight at once in the process (`ObjectStorage.read_many`'s pool; obstore
#: waits for the store without holding the GIL)
READ_PARALLEL = 16
_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _read_pool() -> ThreadPoolExecutor:
    """The process's pool of readers, made anew in a forked child (whose copy has no threads)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(READ_PARALLEL, thread_name_prefix="feedlog-store-read"))
        return _pool[1]


def _forget_pool_in_child() -> None:
    """A forked child starts with no pool and a free lock (the parent's threads are not in it, and
    a fork while another thread held the lock would leave it held forever)."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


class ObjectStorage:
    """A table under a URL on an object store, through obstore (module docstring)."""

    def __init__(self, url: str, options: Mapping[str, str] | None = None, *, store: ObjectStore | None = None) -> None:
        self.url = url.rstrip("/")
        scheme = scheme_of(self.url) or ""
        self._scheme = scheme
        try:
            config, client, retry = _split_options(scheme, options or {})
        except InvalidArgument as e:
            raise InvalidArgument(f"{self.url}: {e}") from None
        if scheme in ("s3", "s3a") and store is None:
            _check_s3_credentials(self.url, options or {})
        if store is not None:
            self.store = store
        elif scheme == "memory":
            self.store = _memory_store(self.url[len("memory://") :])
        else:
            kwargs: dict[str, Any] = {}
            if config:
                kwargs["config"] = config
            if client:
                kwargs["client_options"] = client
            if retry:
                kwargs["retry_config"] = retry
            target = self.url
            if scheme == "file":
                path = urlsplit(self.url).path
                os.makedirs(path, exist_ok=True)  # obstore's LocalStore needs its root to exist
                target = self.url + "/"
            try:
                self.store = from_url(target, **kwargs)
            except UnknownConfigurationKeyError as e:
                raise InvalidArgument(f"{self.url}: {_one_line(e)}") from None
            except BaseException as e:  # obstore panics (pyo3 PanicException) on some bad input
                if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
                    raise
                key = _option_named(options or {}, str(e))
                if key is not None:
                    raise InvalidArgument(
                        f"bad storage option {key}={(options or {})[key]!r} for {self.url}: {_one_line(e)}"
                    ) from None
                raise InvalidArgument(f"bad storage URL or options for {self.url}: {_one_line(e)}") from None
        #: one probe per store (scheme, bucket or root, options) and process, not per table handle
        self._probe_key = (scheme, urlsplit(self.url).netloc, tuple(sorted((options or {}).items())))
        if store is not None:
            self._probe_key = (scheme, f"store-{id(store)}", ())
        if scheme == "memory":
            _CONDITIONAL_PUT.setdefault(self._probe_key, True)

    @property
    def location(self) -> str:
        return self.url

    def _where(self, path: str) -> str:
        return f"{self.url}/{path}" if path else self.url

    @contextmanager
    def _errors(self, verb: str, path: str) -> Iterator[None]:
        """obstore's exceptions -> feedlog's typed errors, one line naming the URL."""
        try:
            yield
        except FeedlogError:
            raise
        except Exception as e:
            if "NoSuchBucket" in str(e) or "ContainerNotFound" in str(e):
                bucket = urlsplit(self.url).netloc
                raise NotFound(f"cannot {verb} {self._where(path)}: bucket {bucket!r} does not exist") from None
            if isinstance(e, FileNotFoundError) or "Not a directory" in str(e):  # a path under a file
                raise NotFound(f"{self._where(path)} does not exist") from None
            self._raise_typed(verb, path, e)

    def _raise_typed(self, verb: str, path: str, e: Exception) -> None:
        where, text = self._where(path), str(e)
        if _CREDENTIAL_REQUEST.search(text):  # no credentials given, and the metadata fallback failed too
            family = (
                "gs"
                if self._scheme == "gs"
                else "az"
                if self._scheme in ("az", "abfs", "abfss", "adl", "azure")
                else ""
            )
            if family:
                raise PermissionDenied(
                    f"cannot {verb} {where}: no credentials (set {_CREDENTIAL_HINTS[family]} in the environment "
                    f"or as storage options; getting a token failed: {_store_said(text) or _one_line(e)})"
                ) from None
            profile = "; AWS_PROFILE is not read here" if os.environ.get("AWS_PROFILE") else ""
            raise PermissionDenied(f"cannot {verb} {where}: {_NO_CREDENTIALS}{profile})") from None
        said = _store_said(text)
        if isinstance(e, (PermissionDeniedError, UnauthenticatedError, PermissionError)) or any(
            s in text for s in ("credential", "Credential", "403 Forbidden", "401 Unauthorized")
        ):
            if said is not None:  # the store answered: bad keys, or keys without the permission
                raise PermissionDenied(
                    f"cannot {verb} {where}: the store refused access ({said}); check the credentials and "
                    "what they may do"
                ) from None
            raise PermissionDenied(f"cannot {verb} {where}: {_one_line(e)}") from None
        if isinstance(e, (NotSupportedError, NotImplementedError)):
            raise Unsupported(f"cannot {verb} {where}: {_one_line(e)}") from None
        detail = said if said is not None and "<Code>" in text else _one_line(e)
        raise Unavailable(f"cannot {verb} {where}: {detail}") from None

    def list(self, directory: str, start_after: str | None = None, stat: bool = True) -> list[FileInfo]:
        prefix = f"{directory}/" if directory else ""
        out = []
        with self._errors("list", directory):
            if start_after is None:
                found = obstore.list_with_delimiter(self.store, directory or None)["objects"]
            else:
                found = [
                    meta
                    for chunk in obstore.list(self.store, directory or None, offset=prefix + start_after)
                    for meta in chunk
                ]
        for meta in found:
            path = meta["path"]
            if not path.startswith(prefix):
                continue
            name = path[len(prefix) :]
            if not name or "/" in name or name.startswith(".") or (start_after is not None and name <= start_after):
                continue
            if self._scheme == "file" and "#" in name:  # obstore's local in-flight file (`name#n`)
                continue
            if stat:
                out.append(FileInfo(path, meta["size"], int(meta["last_modified"].timestamp() * 1000)))
            else:
                out.append(FileInfo(path, None, None))
        out.sort()
        return out

    def walk(
        self, prune: Callable[[str], bool] | None = None, skip: Callable[[str], Container[str]] | None = None
    ) -> Iterator[FileInfo]:
        """Every object under the table's prefix (the storage contract's `walk`): one delimited listing
        of the top level, so a pruned top-level directory (`_delta_log/`) is never listed, then a
        streamed listing of each other prefix, a page at a time. Deeper directories are pruned by
        filtering (an object store has no directories to skip).

        A `file://` table is walked as a local directory (`LocalStorage.walk`): obstore's local store
        follows symbolic links, and a walk that vacuum deletes from must never leave the table."""
        if self._scheme == "file":
            root = url2pathname(urlsplit(self.url).path)
            yield from LocalStorage(root, fsync=False).walk(prune, skip)
            return
        with self._errors("list", ""):
            top = obstore.list_with_delimiter(self.store, None)
        for meta in top["objects"]:
            if info := self._info_of(meta, prune, skip):
                yield info
        for prefix in sorted(top["common_prefixes"]):
            name = prefix.rstrip("/")
            if prune is not None and prune(name):
                continue
            with self._errors("list", name):
                pages = iter(obstore.list(self.store, name + "/", chunk_size=1000))
                while True:
                    with self._errors("list", name):
                        page = next(pages, None)
                    if page is None:
                        break
                    for meta in page:
                        if info := self._info_of(meta, prune, skip):
                            yield info

    def _info_of(
        self, meta: Any, prune: Callable[[str], bool] | None, skip: Callable[[str], Container[str]] | None
    ) -> FileInfo | None:
        path = str(meta["path"])
        if skip is not None:
            directory, _, name = path.rpartition("/")
            if name in skip(directory):
                return None
        if self._scheme == "file" and "#" in path.rsplit("/", 1)[-1]:  # obstore's local in-flight file
            return None
        parts = path.split("/")[:-1]
        if prune is not None and any(prune("/".join(parts[: i + 1])) for i in range(1, len(parts))):
            return None
        return FileInfo(path, int(meta["size"]), int(meta["last_modified"].timestamp() * 1000))

    def read(self, path: str) -> bytes:
        with self._errors("read", path):
            return bytes(obstore.get(self.store, path).bytes())

    def read_many(self, paths: Sequence[str]) -> builtins.list[bytes | FeedlogError]:
        """`read` of each path, in order, a failure in its place; up to `READ_PARALLEL` reads in flight
        at once (a log replay reads its commit files one round trip each: ten commits after a
        checkpoint cost ten round trips one after another)."""
        if len(paths) < 2:
            return [self._read_or_error(p) for p in paths]
        try:
            return list(_read_pool().map(self._read_or_error, paths))
        except RuntimeError:  # the interpreter is shutting down: no new threads, so one after another
            return [self._read_or_error(p) for p in paths]

    def _read_or_error(self, path: str) -> bytes | FeedlogError:
        try:
            return self.read(path)
        except FeedlogError as e:
            return e

    def read_bounded(self, path: str, limit: int) -> bytes:
        """The object, or InvalidArgument if it is larger than `limit` bytes: the size comes with the
        response's metadata, so a huge object is refused without its body being read."""
        with self._errors("read", path):
            got = obstore.get(self.store, path)
            size = int(got.meta["size"])
            if size > limit:
                raise InvalidArgument(f"{self._where(path)} is larger than the {limit}-byte limit ({size} bytes)")
            data = bytes(got.bytes())
        if len(data) > limit:  # replaced by a larger object between the metadata and the body
            raise InvalidArgument(f"{self._where(path)} is larger than the {limit}-byte limit")
        return data

    def stat(self, path: str) -> FileInfo:
        with self._errors("stat", path):
            meta = obstore.head(self.store, path)
        return FileInfo(path, meta["size"], int(meta["last_modified"].timestamp() * 1000))

    def _create(self, path: str, data: bytes) -> bool:
        try:
            obstore.put(self.store, path, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        return True

    def _probe(self) -> bool:
        """Whether the store refuses a second create of one name (If-None-Match honoured)."""
        name = f"_delta_log/.feedlog-probe-{uuid.uuid4().hex}"
        try:
            with self._errors("write", name):
                try:
                    self._create(name, b"1")
                except (NotSupportedError, NotImplementedError):
                    return False
                try:
                    return not self._create(name, b"2")
                except (NotSupportedError, NotImplementedError):
                    return False
        finally:
            with suppress(Exception):  # the probe is hidden from listings; a leftover harms no reader
                obstore.delete(self.store, name)

    def conditional_put(self) -> bool:
        """Whether this store has conditional put (probed once per store in a process)."""
        known = _CONDITIONAL_PUT.get(self._probe_key)
        if known is not None:
            return known
        with _PROBE_LOCK:
            if self._probe_key not in _CONDITIONAL_PUT:
                _CONDITIONAL_PUT[self._probe_key] = self._probe()
            return _CONDITIONAL_PUT[self._probe_key]

    def put_if_absent(self, path: str, data: bytes) -> bool:
        if not self.conditional_put():
            if _COMMIT_FILE.search(path):
                raise Unsupported(
                    f"{self.url}: this store has no conditional put (If-None-Match), so a filesystem-committed "
                    "Delta table cannot be written safely here; use a managed table (a commit owner decides "
                    "commits) or a store with conditional put"
                )
            # a unique name (data files, staged commits): nobody else writes it
            with self._errors("write", path):
                try:
                    obstore.head(self.store, path)
                    return False
                except FileNotFoundError:
                    pass
                obstore.put(self.store, path, bytes(data))
                return True
        with self._errors("write", path):
            return self._create(path, bytes(data))

    def write_atomic(self, path: str, data: bytes) -> None:
        with self._errors("write", path):
            obstore.put(self.store, path, bytes(data))

    def delete(self, path: str) -> None:
        with self._errors("delete", path):
            try:
                obstore.delete(self.store, path)
            except FileNotFoundError as e:
                if "NoSuchBucket" in str(e):
                    raise

    def delete_in(self, directory: str, names: Iterable[str]) -> int:
        """The storage module's `delete_in`: one bulk delete (S3's DeleteObjects takes up to 1000 keys a
        request); where one of them is missing, each alone (a missing one is no error)."""
        paths = [f"{directory}/{name}" if directory else name for name in names]
        if not paths:
            return 0
        try:
            with self._errors("delete", paths[0]):
                obstore.delete(self.store, paths)
        except NotFound:
            for path in paths:
                self.delete(path)
        return len(paths)


def parse_storage_options(items: Sequence[str] | None) -> dict[str, str] | None:
    """`KEY=VALUE` strings (the CLI's repeated --storage-option) as a dict, None when there are none;
    a malformed or repeated one is InvalidArgument."""
    options: dict[str, str] = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or key != key.strip():
            raise InvalidArgument(f"bad --storage-option {item!r}: expected KEY=VALUE")
        if key in options:
            raise InvalidArgument(f"--storage-option {key} given twice")
        options[key] = value
    return options or None
