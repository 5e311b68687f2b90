"""What `feedlog serve` and `feedlog owner serve` export to Prometheus (docs/metrics.md lists every family).

- `GrpcMetrics`: a server interceptor with the gRPC ecosystem's families
  (go-grpc-prometheus / py-grpc-prometheus: `grpc_server_started_total`,
  `grpc_server_handled_total`, `grpc_server_handling_seconds`, `grpc_server_msg_received_total`,
  `grpc_server_msg_sent_total`), and the stream cap's open and refused streams (rpc.StreamCap).
- `PeerMetrics`: feeds hosted, blocks and bytes stored, puts and group commits, fsync latency, each
  followed feed's lag, compaction work.
- `OwnerMetrics`: commits ratified, conflicts by kind, ratification latency, backfill lag per table,
  database errors.

Label values never come from a stranger: a gRPC method is named only if the server's own method
table has it (anything else is `unknown`), a feed only if this peer hosts or follows it, a table only
if the owner's database holds it (at most `MAX_TABLE_SERIES` of them, the most behind first).
Components keep plain counters and the collectors here read them at scrape time, so the hot paths
pay only for the histograms (one observation per group commit, per fsync, per RPC).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from google.protobuf import descriptor_pool
from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from feedlog.delta.committer import CommitConflict, CommitResponse
from feedlog.errors import FeedlogError

if TYPE_CHECKING:
    from feedlog.delta.managed.sqlite import LocalOwner

    from .compaction import Compactor
    from .follower import Follower
    from .host import FeedHost

#: the label value of a method, service or type not in the server's method table
UNKNOWN = "unknown"
#: grpc_code label values as gRPC's other implementations spell them (Go's `codes.Code.String()`),
#: so dashboards made for go-grpc-prometheus work unchanged
CODE_NAMES = {
    c: "OK" if c is grpc.StatusCode.OK else "".join(w.capitalize() for w in c.name.split("_")) for c in grpc.StatusCode
}
CODE_NAMES[grpc.StatusCode.CANCELLED] = "Canceled"
#: group-commit sizes in entries: one lone put up to a full group (group_commit max_batch 10,000)
GROUP_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
#: fsync and commit latencies: ~350 µs is a good disk here (FIELD-NOTES), seconds a sick one
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: per-table series the owner exports at most (the tables furthest behind first)
MAX_TABLE_SERIES = 1000


class StreamCounts(Protocol):
    """What the metrics read of a stream cap (rpc.StreamCap; named here, not imported: rpc imports this)."""

    @property
    def open(self) -> int: ...

    limit: int
    refused: dict[str, int]


def _grpc_type(client_streaming: bool, server_streaming: bool) -> str:
    if client_streaming:
        return "bidi_stream" if server_streaming else "client_stream"
    return "server_stream" if server_streaming else "unary"


class _Method:
    """One method's label children, bound once (a `labels()` lookup per call would cost a lock and a dict)."""

    __slots__ = ("_handled", "_handled_family", "_labels", "received", "seconds", "sent", "started")

    def __init__(self, m: GrpcMetrics, service: str, method: str, kind: str) -> None:
        self._labels = (kind, service, method)
        self.started = m.started.labels(*self._labels)
        self.received = m.received.labels(*self._labels)
        self.sent = m.sent.labels(*self._labels)
        self.seconds = m.seconds.labels(*self._labels)
        self._handled_family = m.handled
        self._handled: dict[grpc.StatusCode, Any] = {}
        self.handled(grpc.StatusCode.OK)  # a method never called still shows 0 (rate() needs the series)

    def handled(self, code: grpc.StatusCode) -> Any:
        child = self._handled.get(code)
        if child is None:
            child = self._handled[code] = self._handled_family.labels(*self._labels, CODE_NAMES[code])
        return child

    def done(self, code: grpc.StatusCode, began: float) -> None:
        self.handled(code).inc()
        self.seconds.observe(time.perf_counter() - began)


def _code(context: grpc.ServicerContext, failed: bool) -> grpc.StatusCode:
    """The status a call ended with: what the handler set or aborted with; CANCELLED if the call was over
    before the handler returned (the client cancelled, or its deadline passed: a stream's handler then ends
    quietly, `while context.is_active()`); else OK, or UNKNOWN if the handler raised."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if not context.is_active():
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK


class GrpcMetrics(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc's base class is untyped
    """The gRPC server families for the services named (full names, e.g. `feedlog.Feeds`) plus health and
    reflection, which every feedlog server carries; `watch` adds a stream cap's gauges."""

    def __init__(self, registry: Any, services: Sequence[str]) -> None:
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        self.started = Counter("grpc_server_started_total", "RPCs started on the server.", labels, registry=registry)
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, whatever their status.",
            [*labels, "grpc_code"],
            registry=registry,
        )
        self.received = Counter(
            "grpc_server_msg_received_total", "Request messages received by the server.", labels, registry=registry
        )
        self.sent = Counter(
            "grpc_server_msg_sent_total", "Response messages sent by the server.", labels, registry=registry
        )
        self.seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time from an RPC's start to its end on the server (a stream: its whole life).",
            labels,
            registry=registry,
        )
        self._methods: dict[str, _Method] = {}
        pool = descriptor_pool.Default()
        for name in (*services, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"):
            try:
                desc = pool.FindServiceByName(name)
            except KeyError:
                continue
            for md in desc.methods:
                kind = _grpc_type(md.client_streaming, md.server_streaming)
                self._methods[f"/{desc.full_name}/{md.name}"] = _Method(self, desc.full_name, md.name, kind)
        self._unknown: _Method | None = None
        self._registry = registry

    @property
    def unknown(self) -> _Method:
        """The one child set every method outside the table counts against (made on first use)."""
        if self._unknown is None:
            self._unknown = _Method(self, UNKNOWN, UNKNOWN, UNKNOWN)
        return self._unknown

    def watch(self, cap: StreamCounts) -> None:
        """Export `cap`'s open streams, its limit and the streams it refused."""
        self._registry.register(_StreamCollector(cap))

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        h = continuation(details)
        m = self._methods.get(details.method) if h is not None else None
        if h is None:  # gRPC answers UNIMPLEMENTED; the stranger's name is never a label
            u = self.unknown
            u.started.inc()
            u.done(grpc.StatusCode.UNIMPLEMENTED, time.perf_counter())
            return None
        if m is None:
            m = self.unknown
        if h.response_streaming:
            field = "stream_stream" if h.request_streaming else "unary_stream"
            return h._replace(**{field: self._stream_out(m, getattr(h, field), h.request_streaming)})
        if h.request_streaming:
            return h._replace(stream_unary=self._unary_out(m, h.stream_unary, True))
        return h._replace(unary_unary=self._unary_out(m, h.unary_unary, False))

    @staticmethod
    def _counted(m: _Method, requests: Iterator[Any]) -> Iterator[Any]:
        for r in requests:
            m.received.inc()
            yield r

    def _unary_out(self, m: _Method, inner: Callable[..., Any], streaming_in: bool) -> Callable[..., Any]:
        counted = self._counted

        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            m.started.inc()
            if streaming_in:
                request = counted(m, request)
            else:
                m.received.inc()
            began = time.perf_counter()
            try:
                response = inner(request, context)
            except BaseException:
                m.done(_code(context, True), began)
                raise
            code = _code(context, False)
            if code is grpc.StatusCode.OK:
                m.sent.inc()
            m.done(code, began)
            return response

        return handle

    def _stream_out(self, m: _Method, inner: Callable[..., Any], streaming_in: bool) -> Callable[..., Any]:
        counted = self._counted

        def handle(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            m.started.inc()
            if streaming_in:
                request = counted(m, request)
            else:
                m.received.inc()
            began = time.perf_counter()
            code: grpc.StatusCode | None = None
            try:
                for response in inner(request, context):
                    m.sent.inc()
                    yield response
            except GeneratorExit:  # the client went away: gRPC dropped the stream
                code = grpc.StatusCode.CANCELLED
                raise
            except BaseException:
                code = _code(context, True)
                raise
            finally:
                m.done(code or _code(context, False), began)

        return handle


class _StreamCollector(Collector):
    def __init__(self, cap: StreamCounts) -> None:
        self.cap = cap

    def collect(self) -> Iterable[Any]:
        yield GaugeMetricFamily(
            "feedlog_streams_open", "Streams open now (reads, tails, pipelined writes).", self.cap.open
        )
        yield GaugeMetricFamily("feedlog_streams_limit", "Streams open at most (--max-streams).", self.cap.limit)
        refused = CounterMetricFamily(
            "feedlog_streams_refused",
            "Streams refused: the server was full (server_full) or the client had its share (client_share).",
            labels=["reason"],
        )
        for reason, n in sorted(self.cap.refused.items()):
            refused.add_metric([reason], n)
        yield refused


# ---- a peer (`feedlog serve`) -------------------------------------------------------------------


class PeerMetrics(Collector):
    """A peer's own families. `committed`/`fsynced` are the hot-path observers (FeedHost hands them to
    each feed's group committer and log); everything else is read from the host at scrape time."""

    def __init__(self, registry: Any) -> None:
        self.group_entries = Histogram(
            "feedlog_group_commit_entries",
            "Entries per group commit of server-side puts (one signature, one fsync each).",
            buckets=GROUP_BUCKETS,
            registry=registry,
        )
        self.group_seconds = Histogram(
            "feedlog_group_commit_seconds",
            "Time to append one group durably: encode, sign, write, fsync.",
            buckets=FSYNC_BUCKETS,
            registry=registry,
        )
        self.fsync_seconds = Histogram(
            "feedlog_fsync_seconds",
            "Time of each fdatasync of a feed's log (puts, appends, replicated batches).",
            buckets=FSYNC_BUCKETS,
            registry=registry,
        )
        self.host: FeedHost | None = None
        self.followers: Sequence[Follower] = ()
        self.compactor: Compactor | None = None
        registry.register(self)

    def committed(self, entries: int, seconds: float) -> None:
        self.group_entries.observe(entries)
        self.group_seconds.observe(seconds)

    def fsynced(self, seconds: float) -> None:
        self.fsync_seconds.observe(seconds)

    def attach(self, host: FeedHost, followers: Sequence[Follower], compactor: Compactor | None) -> None:
        self.host, self.followers, self.compactor = host, followers, compactor

    def collect(self) -> Iterable[Any]:
        if self.host is None:
            return
        feeds = self.host.feeds()
        hosted = GaugeMetricFamily("feedlog_feeds_hosted", "Feeds this peer hosts.", labels=["role"])
        owned = sum(1 for hf in feeds if hf.committer is not None)
        hosted.add_metric(["owned"], owned)
        hosted.add_metric(["replica"], len(feeds) - owned)
        yield hosted
        blocks = GaugeMetricFamily("feedlog_feed_blocks", "Blocks (entries) a hosted feed holds.", labels=["feed"])
        size = GaugeMetricFamily("feedlog_feed_bytes", "Bytes of blocks a hosted feed holds.", labels=["feed"])
        puts = CounterMetricFamily(
            "feedlog_put_entries", "Entries committed by server-side puts (Put, PutStream).", labels=["feed"]
        )
        groups = CounterMetricFamily(
            "feedlog_group_commits", "Group commits of server-side puts (one signed batch each).", labels=["feed"]
        )
        for hf in sorted(feeds, key=lambda f: f.key):
            key = hf.key.hex()
            core = hf.feed.core
            blocks.add_metric([key], core.state.length)
            size.add_metric([key], core.byte_length)
            if hf.committer is not None:
                puts.add_metric([key], hf.committer.entries)
                groups.add_metric([key], hf.committer.batches)
        yield from (blocks, size, puts, groups)
        yield from _follower_families(self.followers)
        if self.compactor is not None:
            yield from _compaction_families(self.compactor)


def _follower_families(followers: Sequence[Follower]) -> Iterator[Any]:
    behind = GaugeMetricFamily(
        "feedlog_follow_entries_behind",
        "Entries the upstream has signed (as far as this follower has heard) that it has not stored.",
        labels=["feed"],
    )
    age = GaugeMetricFamily(
        "feedlog_follow_seconds_since_verified_batch",
        "Seconds since the follower last stored a verified batch (since it started, if it has not yet).",
        labels=["feed"],
    )
    connected = GaugeMetricFamily(
        "feedlog_follow_connected", "1 while the follower holds a subscription to its upstream.", labels=["feed"]
    )
    rejected = CounterMetricFamily(
        "feedlog_follow_rejected_batches", "Batches from the upstream that did not verify.", labels=["feed"]
    )
    now = time.monotonic()
    for f in followers:
        key = f.key.hex()
        behind.add_metric([key], f.behind())
        age.add_metric([key], max(0.0, now - f.last_verified))
        connected.add_metric([key], 1 if f.connected else 0)
        rejected.add_metric([key], f.rejections)
    yield from (behind, age, connected, rejected)


def _compaction_families(c: Compactor) -> Iterator[Any]:
    t = c.totals
    yield CounterMetricFamily("feedlog_compaction_passes", "Scheduled compaction passes done.", c.passes)
    yield CounterMetricFamily("feedlog_compaction_entries_read", "Entries compaction read.", t.entries)
    yield CounterMetricFamily(
        "feedlog_compaction_entries_skipped", "Entries compaction skipped (nothing in them expires yet).", t.skipped
    )
    yield CounterMetricFamily("feedlog_compaction_entries_cleared", "Expired payloads compaction cleared.", t.cleared)
    yield CounterMetricFamily("feedlog_compaction_bytes_cleared", "Bytes of payloads compaction cleared.", t.bytes)
    yield CounterMetricFamily("feedlog_compaction_seconds", "Time spent in compaction passes.", t.seconds)


# ---- the commit owner (`feedlog owner serve`) ---------------------------------------------------


def conflict_kind(r: CommitConflict) -> str:
    """A lost ratification's kind, from the answer's shape alone (bounded: four values):
    `pending` (the version is being ratified for the writer ahead), `taken` (another commit has it:
    the winners come back), `retry` (refused for now: a held turn, a rebase on a commit that was not
    ratified), `refused` (never: a gap, a table released)."""
    if r.pending:
        return "pending"
    if r.winners:
        return "taken"
    return "retry" if r.retryable else "refused"


class OwnerMetrics(Collector):
    """The commit owner's families; `answered` is called by the service for every Commit/Release."""

    def __init__(self, registry: Any) -> None:
        self.conflicts = Counter(
            "feedlog_owner_conflicts_total",
            "Commits not ratified, by kind (pending, taken, retry, refused).",
            ["kind"],
            registry=registry,
        )
        self._kinds = {k: self.conflicts.labels(k) for k in ("pending", "taken", "retry", "refused")}
        self.errors = Counter(
            "feedlog_owner_request_errors_total",
            "Commit requests that failed with an error (invalid, not found, denied, unavailable).",
            registry=registry,
        )
        self.latency = Histogram(
            "feedlog_owner_ratification_seconds",
            "Time to answer a commit request that was ratified (turn waits included).",
            buckets=(*FSYNC_BUCKETS, 5.0, 10.0),
            registry=registry,
        )
        self.owner: LocalOwner | None = None
        registry.register(self)

    def attach(self, owner: LocalOwner) -> None:
        self.owner = owner

    def answered(self, r: CommitResponse | FeedlogError, seconds: float) -> None:
        if isinstance(r, FeedlogError):
            self.errors.inc()
        elif isinstance(r, CommitConflict):
            self._kinds[conflict_kind(r)].inc()
        else:
            self.latency.observe(seconds)

    def collect(self) -> Iterable[Any]:
        owner = self.owner
        if owner is None:
            return
        yield CounterMetricFamily(
            "feedlog_owner_commits_ratified",
            "Commits this process ratified (recorded in the database).",
            owner.ratified,
        )
        yield CounterMetricFamily(
            "feedlog_owner_database_errors",
            "Errors from the owner's database (SQLite or PostgreSQL), each answered as Unavailable.",
            owner.database.failures,
        )
        try:
            states = owner.database.read("SELECT state, COUNT(*) FROM tables GROUP BY state", ())
            lag = owner.database.read(
                "SELECT t.id, t.latest - t.backfilled, MIN(c.ratified_ms) FROM tables t "
                "LEFT JOIN commits c ON c.table_id = t.id AND c.version > t.backfilled "
                "WHERE t.state IN ('active', 'releasing') GROUP BY t.id, t.latest, t.backfilled "
                "ORDER BY t.latest - t.backfilled DESC, t.id LIMIT ?",
                (MAX_TABLE_SERIES,),
            )
        except FeedlogError:  # the database is down or closing: its error counter says so
            return
        tables = GaugeMetricFamily(
            "feedlog_owner_tables", "Tables the owner's database holds, by state.", labels=["state"]
        )
        for state, n in states:
            tables.add_metric([str(state)], int(n))
        yield tables
        versions = GaugeMetricFamily(
            "feedlog_owner_backfill_lag_versions",
            "Ratified commits of a table not yet copied to its _delta_log.",
            labels=["table"],
        )
        seconds = GaugeMetricFamily(
            "feedlog_owner_backfill_lag_seconds",
            "Age of a table's oldest ratified commit not yet in its _delta_log (0: none).",
            labels=["table"],
        )
        now = owner.clock.now_ms()
        for table_id, behind, oldest in lag:
            versions.add_metric([str(table_id)], max(0, int(behind)))
            seconds.add_metric([str(table_id)], 0.0 if oldest is None else max(0, now - int(oldest)) / 1000)
        yield versions
        yield seconds
