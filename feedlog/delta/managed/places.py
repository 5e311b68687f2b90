"""Where an owner's tables may live, and the storage it reaches them through.

A table is named by the location its writers use: an absolute local path, or an
object-store URL (`s3://bucket/prefix/table`, `gs://`, `az://`, `abfss://`,
`memory://`; a `file://` URL is the local path it names). The owner is a service
that faces strangers, so a location is checked where it enters:

- a local path is resolved (`realpath`) and must lie strictly below one of the
  owner's local roots; its `_delta_log` may not be a link leading elsewhere;
- a URL must be in canonical form (no `.`/`..`/empty segments, no user, query or
  fragment, no control characters) and lie strictly below one of the owner's URL
  roots: a plain string rule, since an object store has no links to follow.

With no roots at all (the in-process owner, which serves only its own process)
any location is allowed. The owner opens object stores with *its own* storage
options (`feedlog owner serve --storage-option`), never with anything a writer or a
table supplies: one `ObjectStorage` per table location, kept for reuse.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from ...errors import InvalidArgument, PermissionDenied, shorten
from ..objectstore import OBJECT_SCHEMES, ObjectStorage, scheme_of
from ..storage import LocalStorage, Storage
from .staged import COMMITS_DIR

#: locations are bounded by the OS for paths; URLs get the same bound
MAX_LOCATION = 4096
#: object stores kept open at once (each holds an HTTP connection pool)
_MAX_OPEN_STORES = 256


def _canonical_url(location: str, what: str = "table location") -> str:
    """`location` as the one spelling of a URL the owner records, or InvalidArgument naming `what`."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in location):
        raise InvalidArgument(f"{what} {shorten(location)!r} contains control characters")
    scheme = scheme_of(location)
    if scheme not in OBJECT_SCHEMES:
        raise InvalidArgument(
            f"{what} {shorten(location)!r}: unsupported scheme (use an absolute path or one of "
            "s3://, gs://, az://, abfss://, memory://)"
        )
    parts = urlsplit(location)
    if parts.query or parts.fragment or "@" in parts.netloc or not parts.netloc:
        raise InvalidArgument(f"{what} {shorten(location)!r} is not a plain bucket/prefix URL")
    segments = parts.path.rstrip("/").split("/")[1:] if parts.path not in ("", "/") else []
    if any(s in ("", ".", "..") for s in segments):
        raise InvalidArgument(f"{what} {shorten(location)!r} has empty, '.' or '..' segments")
    return f"{scheme}://{parts.netloc}" + "".join("/" + s for s in segments)


class Places:
    """The roots an owner serves, and the check and storage for one table location."""

    def __init__(
        self, roots: Sequence[str | os.PathLike[str]] | None, storage_options: Mapping[str, str] | None = None
    ) -> None:
        self.local: list[str] | None = None
        self.urls: list[str] | None = None
        if roots is not None:
            self.local, self.urls = [], []
            for r in roots:
                text = os.fspath(r)
                if scheme_of(text) is None:
                    self.local.append(os.path.realpath(text))
                elif scheme_of(text) == "file":
                    self.local.append(os.path.realpath(urlsplit(text).path))
                else:
                    self.urls.append(_canonical_url(text, "commit owner root"))
        self.options = dict(storage_options or {})
        self._stores: OrderedDict[str, ObjectStorage] = OrderedDict()
        self._lock = threading.Lock()
        for url in self.urls or ():
            self._stores[url] = ObjectStorage(url, self.options)  # bad options fail now, not on a first commit

    def confine(self, location: str) -> str:
        """The canonical location of a table the owner may serve, or InvalidArgument / PermissionDenied."""
        if not location or len(location) > MAX_LOCATION or "\0" in location:
            raise InvalidArgument(f"table location {shorten(location)!r} is not a usable path or URL")
        scheme = scheme_of(location)
        if scheme is None:
            return self._confine_path(location)
        if scheme == "file":
            return self._confine_path(urlsplit(location).path or "/")
        url = _canonical_url(location)
        if self.urls is not None:
            if url in self.urls:
                raise PermissionDenied(
                    f"{shorten(location)} is a root of this commit owner: a table must be a prefix below it"
                )
            if not any(url.startswith(r + "/") for r in self.urls):
                raise PermissionDenied(f"{shorten(location)} is outside the locations this commit owner serves")
        return url

    def _confine_path(self, path: str) -> str:
        if not os.path.isabs(path):
            raise InvalidArgument(f"table path must be absolute, got {shorten(path)!r}")
        real = os.path.realpath(path)
        roots = self.local
        if roots is not None and not any(os.path.commonpath([real, r]) == r for r in roots):
            raise PermissionDenied(f"{shorten(path)} is outside the directories this commit owner serves")
        if real == "/" or (roots is not None and real in roots):
            # a table at a root would hold every other table under it in its own directory
            raise PermissionDenied(
                f"{shorten(path)} is a root of this commit owner: a table must be a directory below it"
            )
        return real

    def adopt(self, storage: Storage) -> None:
        """Use `storage` for the table at its location: only for an owner without roots (in process,
        where the table handle's credentials are this process's own); a served owner ignores it."""
        if self.urls is None and isinstance(storage, ObjectStorage):
            place = _canonical_url(storage.location)
            with self._lock:
                self._stores[place] = storage
                self._stores.move_to_end(place)
                while len(self._stores) > _MAX_OPEN_STORES:
                    self._stores.popitem(last=False)

    def storage(self, location: str) -> Storage:
        """The storage of a table at `location` (already confined, or confined here)."""
        place = self.confine(location)
        if scheme_of(place) is None:
            self._confine_path(os.path.join(place, COMMITS_DIR))  # a symlinked _delta_log may not lead out
            return LocalStorage(place)
        with self._lock:
            store = self._stores.get(place)
            if store is not None:
                self._stores.move_to_end(place)
                return store
        store = ObjectStorage(place, self.options)
        with self._lock:
            self._stores.setdefault(place, store)
            while len(self._stores) > _MAX_OPEN_STORES:
                self._stores.popitem(last=False)
        return store
