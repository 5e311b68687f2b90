"""What the console shows: the feeds and tables named on its command line, resolved once at start.

A page addresses a feed or a table by its position in this set (`/feeds/3`), never by a path or
URL taken from the request: nothing a stranger sends reaches the filesystem or a network
address (issue 39, "no path parameter reaches the filesystem outside the configured directories").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgument, NotFound
from ..lake.feeds import FeedSource
from ..log.core import KEY_FILE
from ..rpc import SCHEME

#: the most feeds one console lists (a --data directory holding more is refused at start)
MAX_FEEDS = 10_000


@dataclass(frozen=True)
class FeedRef:
    index: int
    source: FeedSource  # the trusted key, and a local directory or a peer's address
    name: str  # what the page calls it: the directory's name, or the peer's HOST:PORT

    @property
    def local(self) -> bool:
        return self.source.path is not None


@dataclass(frozen=True)
class TableRef:
    index: int
    location: str  # a directory or an object-store URL, as the operator gave it
    name: str


@dataclass(frozen=True)
class Catalog:
    feeds: tuple[FeedRef, ...]
    tables: tuple[TableRef, ...]
    owners: tuple[str, ...]  # the commit owners trusted for managed tables (as `--owner` elsewhere)
    storage_options: tuple[tuple[str, str], ...] = ()

    def feed(self, index: int) -> FeedRef:
        if not 0 <= index < len(self.feeds):
            raise NotFound(f"no feed {index} (this console shows {len(self.feeds)})")
        return self.feeds[index]

    def table(self, index: int) -> TableRef:
        if not 0 <= index < len(self.tables):
            raise NotFound(f"no table {index} (this console shows {len(self.tables)})")
        return self.tables[index]


def feed_dirs(data: str) -> list[Path]:
    """The feed directories `--data DIR` names: DIR itself if it is a feed, else its feeds (as `feedlog
    serve --data` lays them out: DIR/<name>/; names starting with '.' are feeds being built)."""
    root = Path(data).expanduser()
    if (root / KEY_FILE).is_file():
        return [root]
    if not root.is_dir():
        raise NotFound(f"--data {data}: no such directory")
    out = [d for d in sorted(root.iterdir()) if not d.name.startswith(".") and (d / KEY_FILE).is_file()]
    if len(out) > MAX_FEEDS:
        raise InvalidArgument(f"--data {data}: more than {MAX_FEEDS:,} feeds")
    return out


def build(
    data: Sequence[str] = (),
    peers: Sequence[str] = (),
    tables: Sequence[str] = (),
    owners: Sequence[str] = (),
    storage_options: Sequence[tuple[str, str]] = (),
) -> Catalog:
    """The console's set, each feed once (by key); a bad argument fails here, before anything listens."""
    feeds: list[FeedRef] = []
    seen: set[bytes] = set()

    def add(src: FeedSource, name: str) -> None:
        if src.key in seen:
            return
        seen.add(src.key)
        feeds.append(FeedRef(len(feeds), src, name))

    for d in data:
        for path in feed_dirs(d):
            add(FeedSource.parse(str(path)), path.name)
    for url in peers:
        if not url.startswith(SCHEME):
            raise InvalidArgument(f"--peer {url!r}: expected {SCHEME}HOST:PORT/KEY (a peer does not list its feeds)")
        src = FeedSource.parse(url)
        add(src, src.target or url)
    if len(feeds) > MAX_FEEDS:
        raise InvalidArgument(f"more than {MAX_FEEDS:,} feeds")
    refs = []
    for n, t in enumerate(dict.fromkeys(tables)):
        name = t.rstrip("/").rsplit("/", 1)[-1] or t
        refs.append(TableRef(n, t, name))
    if not feeds and not refs:
        raise InvalidArgument("nothing to show: give --data DIR, --peer grpc://HOST:PORT/KEY or --table TABLE")
    return Catalog(tuple(feeds), tuple(refs), tuple(owners), tuple(storage_options))
