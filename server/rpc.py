"""What every feedlog gRPC service shares: request parsing, errors as status codes, the server itself."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import faulthandler
import functools
import ipaddress
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeAlias, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from feedlog.errors import FeedlogError, InvalidArgument, ResourceExhausted, Unavailable, shorten
from feedlog.rpc import error_metadata, is_loopback, status_of

from .events import event

if TYPE_CHECKING:  # prometheus_client loads only for a server that exports metrics
    from .metrics import GrpcMetrics

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=Message)
#: a servicer method: a request (or a stream of them) and the call's context in, a response (or a stream) out
Handler: TypeAlias = Callable[[Message | Iterator[Message], grpc.ServicerContext], object]
#: the longest status message a service sends
MAX_STATUS_MESSAGE = 2000

#: threads a server always keeps for unary calls, whatever its streams do
UNARY_HEADROOM = 8


def abort(context: grpc.ServicerContext, err: FeedlogError) -> NoReturn:
    """End the call with `err`'s status code, its message and trailers naming its kind (feedlog.rpc)."""
    context.set_trailing_metadata(error_metadata(err))
    # a backstop for every service: a message is status detail in the trailers, whose size limit
    # would turn an echo of a huge input into an opaque RESOURCE_EXHAUSTED (issue 13 item 15)
    context.abort(status_of(err), shorten(err, MAX_STATUS_MESSAGE))
    raise AssertionError("ServicerContext.abort returned")  # it raises, always


def system_error(e: OSError, method: str) -> FeedlogError:
    """An OS error a handler met as a status without this server's paths: out of file descriptors or
    disk space is ResourceExhausted (the client retries later); anything else is an internal error
    (INTERNAL, not retried: it may be a bug), logged here with its traceback."""
    what = e.strerror or type(e).__name__
    if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT):
        event("system_error", level=logging.WARNING, method=method, errno=e.errno, error=str(e))
        full = "run out of open files" if e.errno in (errno.EMFILE, errno.ENFILE) else "run out of disk space"
        return ResourceExhausted(f"this server has {full} ({what}); retry later", retry_after=5.0)
    event(
        "handler_error",
        level=logging.ERROR,
        method=method,
        error=str(e),
        traceback="".join(traceback.format_exception(e)),
    )
    return FeedlogError(f"internal error in {method}: {what} (the server's log has the details)")


def unary(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(self: object, request: Message, context: grpc.ServicerContext) -> object:
        try:
            return fn(self, request, context)
        except FeedlogError as e:
            abort(context, e)
        except ValueError as e:  # protobuf rejecting a field value
            abort(context, InvalidArgument(str(e)))
        except OSError as e:
            abort(context, system_error(e, fn.__name__))

    return wrapper  # type: ignore[return-value]


def _parse(cls: type[M], raw: bytes) -> M:
    try:
        return cls.FromString(raw)
    except DecodeError as e:
        raise InvalidArgument(f"malformed {cls.DESCRIPTOR.full_name}: {e}") from None


def _parsed(cls: type[M], raws: Iterator[bytes]) -> Iterator[M]:
    for raw in raws:
        yield _parse(cls, raw)


def rpc_handler(service: object, module: ModuleType, name: str) -> grpc.GenericRpcHandler:
    """The service's method handlers, parsing requests here rather than in gRPC.

    gRPC answers a request its deserializer rejects with an opaque INTERNAL;
    parsing in the handler turns malformed bytes into INVALID_ARGUMENT naming
    the message type, like every other bad input.
    """
    desc = module.DESCRIPTOR.services_by_name[name]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for m in desc.methods:
        cls = getattr(module, m.input_type.name)
        fn = getattr(service, m.name)
        out = {"response_serializer": _serialize}
        if m.client_streaming:

            def stream_h(
                raws: Iterator[bytes], ctx: grpc.ServicerContext, fn: Handler = fn, cls: type[Message] = cls
            ) -> object:
                return fn(_parsed(cls, raws), ctx)

            handlers[m.name] = grpc.stream_stream_rpc_method_handler(stream_h, **out)
        else:

            def unary_h(raw: bytes, ctx: grpc.ServicerContext, fn: Handler = fn, cls: type[Message] = cls) -> object:
                try:
                    request = _parse(cls, raw)
                except InvalidArgument as e:
                    abort(ctx, e)
                return fn(request, ctx)

            make = grpc.unary_stream_rpc_method_handler if m.server_streaming else grpc.unary_unary_rpc_method_handler
            handlers[m.name] = make(unary_h, **out)
    return grpc.method_handlers_generic_handler(desc.full_name, handlers)


def _serialize(m: Message | bytes) -> bytes:
    """A response message's bytes; a handler may yield them encoded already (service.FeedsService._messages)."""
    return m if isinstance(m, bytes) else bytes(m.SerializeToString())


def stream_client(context: grpc.ServicerContext) -> str:
    """Who holds a stream, for StreamCap's per-client share: the caller's IPv4 address, or the /64 of
    its IPv6 address (one host's share of addresses); an address that does not parse, as it is."""
    peer = str(context.peer() or "unknown")  # ipv4:1.2.3.4:5678, ipv6:[::1]:5678, unix:/path
    kind, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0].strip("[]") if kind in ("ipv4", "ipv6") else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return peer
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # an IPv4 client of a dual-stack listener
    if isinstance(address, ipaddress.IPv4Address):
        return f"ipv4:{address}"
    return f"ipv6:{ipaddress.IPv6Network((address, 64), strict=False)}"


class StreamCap(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc's base class is untyped
    """At most `limit` streams of any kind at once, on any service; unary calls are never counted. One
    client (`stream_client`: an address, so every local process is one client on loopback) gets
    `per_client` of them whatever others hold, and more only while `reserve` slots stay free.

    Each open stream holds a worker thread for as long as it lasts: with every stream kind counted
    (Read too, health Watch, reflection), the pool always keeps `workers - limit` threads for unary
    calls. An idle Subscribe costs nothing to open, so without the per-client share one client could
    shut every other reader and follower out for as long as it liked.
    """

    def __init__(self, limit: int, per_client: int | None = None) -> None:
        self.limit = limit
        self.per_client = max(1, limit // 2) if per_client is None else per_client
        if self.per_client < 1:
            raise InvalidArgument(f"streams per client must be >= 1, got {self.per_client}")
        #: slots a client beyond its share leaves free for others: with spare slots, one client (Spark's
        #: tasks on one host, a follower of many feeds) may hold more than its share, never all
        self.reserve = max(0, min(limit - self.per_client, limit // 4))
        self._lock = threading.Lock()
        self._count = 0
        self._clients: dict[str, int] = {}
        #: streams refused, by why (read by the metrics: server/metrics.py)
        self.refused = {"server_full": 0, "client_share": 0}

    @property
    def open(self) -> int:
        """Streams open now."""
        return self._count

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        h = continuation(details)
        if h is None or not (h.request_streaming or h.response_streaming):
            return h
        if h.response_streaming:
            field = "stream_stream" if h.request_streaming else "unary_stream"
            inner = getattr(h, field)

            def stream_out(request: object, context: grpc.ServicerContext) -> Iterator[object]:
                client = self._enter(context)
                try:
                    yield from inner(request, context)
                finally:
                    self._leave(client)

            return h._replace(**{field: stream_out})
        inner_unary = h.stream_unary

        def stream_in(requests: Iterator[object], context: grpc.ServicerContext) -> object:
            client = self._enter(context)
            try:
                return inner_unary(requests, context)
            finally:
                self._leave(client)

        return h._replace(stream_unary=stream_in)

    def _enter(self, context: grpc.ServicerContext) -> str:
        client = stream_client(context)
        with self._lock:
            mine = self._clients.get(client, 0)
            if self._count < self.limit and (mine < self.per_client or self._count < self.limit - self.reserve):
                self._count += 1
                self._clients[client] = mine + 1
                return client
            full = self._count >= self.limit and mine < self.per_client
            self.refused["server_full" if full else "client_share"] += 1
        abort(
            context,
            ResourceExhausted(
                f"too many open streams on this server (limit {self.limit}); retry later"
                if full
                else f"too many open streams from this client ({mine}; its share is {self.per_client} when the "
                f"server is busy, of {self.limit}); close some, or retry later",
                retry_after=1.0,
            ),
        )

    def _leave(self, client: str) -> None:
        with self._lock:
            self._count -= 1
            left = self._clients[client] - 1
            if left:
                self._clients[client] = left
            else:
                del self._clients[client]


def require_tls_off_loopback(listen: str, tls: object | None, insecure: bool) -> None:
    """Refuse to serve plaintext beyond this machine unless the operator said `--insecure`.

    Tokens travel as call metadata: without TLS anyone on the path reads them.
    """
    if tls is None and not insecure and not is_loopback(listen):
        raise InvalidArgument(
            f"--listen {listen} is reachable from other machines: serve TLS (--tls-cert/--tls-key) "
            "or pass --insecure to send credentials and data in the clear"
        )


class Credentials(Protocol):
    def credentials(self) -> grpc.ServerCredentials: ...


def start_server(
    listen: str,
    handlers: Sequence[grpc.GenericRpcHandler],
    services: Sequence[str],
    *,
    tls: Credentials | None,
    workers: int,
    max_message_bytes: int,
    max_streams: int | None = None,
    max_streams_per_client: int | None = None,
    metrics: GrpcMetrics | None = None,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A started gRPC server with health checking and reflection; Unavailable if it cannot listen.

    Streams of every kind are capped at `max_streams` (a quarter of `workers`
    if None), one client's at `max_streams_per_client` (half of `max_streams` if None: StreamCap),
    and the pool always has UNARY_HEADROOM threads beyond them; the
    server refuses calls beyond its threads with RESOURCE_EXHAUSTED rather
    than queueing them. `metrics`: the gRPC families (server/metrics.py), outermost, so that they
    count what the stream cap refuses too.
    """
    streams = max(1, workers // 4) if max_streams is None else max_streams
    threads = max(workers, streams + UNARY_HEADROOM)
    options: list[tuple[str, int]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.so_reuseport", 0),
    ]
    cap = StreamCap(streams, max_streams_per_client)
    if metrics is not None:
        metrics.watch(cap)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpc"),
        interceptors=(cap,) if metrics is None else (metrics, cap),
        options=options,
        maximum_concurrent_rpcs=threads,
    )
    server.add_generic_rpc_handlers(tuple(handlers))
    checks = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    reflection.enable_server_reflection(
        (*services, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    try:
        port = server.add_insecure_port(listen) if tls is None else server.add_secure_port(listen, tls.credentials())
    except RuntimeError as e:
        raise Unavailable(f"cannot listen on {listen}: {e}") from None
    if not port:
        raise Unavailable(f"cannot listen on {listen} (in use, or not an address of this machine)")
    server.start()
    for name in ("", *services):
        checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, checks


class Startable(Protocol):
    def start(self) -> object: ...

    def stop(self) -> None: ...


def return_large_buffers() -> None:
    """Make glibc give buffers of 128 KiB and more back to the system when they are freed.

    glibc raises its mmap threshold to the largest buffer freed so far (up to
    32 MiB); from then on 1-16 MiB messages come from per-thread arenas and
    stay resident after use, so every stream thread keeps its peak (20 stalled
    readers: +90 MiB instead of +45 MiB). A fixed threshold turns that off.
    Not glibc: nothing to do.
    """
    m_mmap_threshold = -3  # glibc's mallopt parameter number
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "mallopt"):
            libc.mallopt(m_mmap_threshold, 128 << 10)
    except OSError:
        pass


#: seconds a shutdown may take before every thread's stack goes to stderr (once; it goes on)
SLOW_STOP_S = 15.0
#: seconds the process may take to exit once the server stopped cleanly: past them, every thread's stack
#: goes to stderr and the process exits anyway (its state is closed and durable; a stray thread is not
#: worth hanging a shutdown for)
EXIT_LIMIT_S = 5.0


def serve_forever(server: Startable) -> None:
    """Run until SIGTERM or SIGINT, then shut down cleanly (and exit, bounded: `EXIT_LIMIT_S`)."""
    return_large_buffers()
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        event("signal", signal=signal.Signals(signum).name)
        done.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        # Python runs a signal's handler in the main thread, between bytecodes: a signal the kernel
        # hands to another thread (gRPC's) is only seen once this thread wakes, so it wakes each second
        while not done.wait(1.0):
            pass
    finally:
        faulthandler.dump_traceback_later(SLOW_STOP_S)  # a stop that hangs says where
        try:
            server.stop()
        finally:
            faulthandler.cancel_dump_traceback_later()
        for s, h in previous.items():
            signal.signal(s, h)
    threading.Thread(target=_exit_if_stuck, args=(EXIT_LIMIT_S,), name="exit-watchdog", daemon=True).start()


def _exit_if_stuck(limit: float) -> None:
    """Runs (as a daemon) once the server stopped: if the interpreter has not exited within `limit`
    seconds (a thread that does not end keeps it alive), name the threads and exit."""
    time.sleep(limit)
    event("exit_stuck", threads=[t.name for t in threading.enumerate() if t is not threading.current_thread()])
    faulthandler.dump_traceback(all_threads=True)
    sys.stderr.flush()
    os._exit(0)
