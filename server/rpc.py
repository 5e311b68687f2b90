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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, NoReturn, Protocol, TypeAlias, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from feedlog.errors import FeedlogError, InvalidArgument, ResourceExhausted, Unavailable, shorten
from feedlog.rpc import error_metadata, status_of

from .events import event

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
    """An OS error a handler met (out of file descriptors, disk full, ...) as a status the client can
    act on; logged here with what the client is not told (paths on this server)."""
    event("system_error", level=logging.WARNING, method=method, errno=e.errno, error=str(e))
    what = e.strerror or type(e).__name__
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return ResourceExhausted(f"this server has run out of open files ({what}); retry later", retry_after=5.0)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhausted(f"this server's disk is full ({what}); retry later", retry_after=30.0)
    return Unavailable(f"this server could not complete the call: {what}")


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


#: how long a new stream waits for the slot of a stream it had cancelled (StreamCap's fair share)
EVICTION_WAIT = 2.0


def stream_client(context: grpc.ServicerContext) -> str:
    """Who holds a stream, for StreamCap's fair share: the caller's IP address (any port), or on
    loopback, where every local process shares one address, its connection."""
    peer = str(context.peer() or "unknown")  # ipv4:1.2.3.4:5678, ipv6:[::1]:5678, unix:/path
    kind, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0].strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        return peer
    return peer if loopback else f"{kind}:{host}"


class StreamCap(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc's base class is untyped
    """At most `limit` streams of any kind at once, on any service; unary calls are never counted.

    Each open stream holds a worker thread for as long as it lasts: with
    every stream kind counted (Read too, health Watch, reflection), the pool
    always keeps `workers - limit` threads for unary calls.

    One client may use every slot while nobody else wants one (a peer following many feeds of this
    one holds a stream per feed), but not keep them from others: when the cap is reached, a client
    holding at most one stream fewer than the biggest holder (`stream_client`) cancels that
    holder's newest stream and takes its slot. An idle Subscribe costs nothing to open, so
    without this one client could shut every reader and follower out for as long as it liked.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._cond = threading.Condition()
        self._open: dict[str, list[grpc.ServicerContext]] = {}  # client -> its open streams, oldest first
        self._count = 0
        #: id() of each stream cancelled to make room, until it ends -> the wait of the stream that cancelled it
        self._evicted: dict[int, _Eviction] = {}
        self._reserved = 0  # slots freed by evicted streams, held for the streams that cancelled them

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
                    self._leave(client, context)

            return h._replace(**{field: stream_out})
        inner_unary = h.stream_unary

        def stream_in(requests: Iterator[object], context: grpc.ServicerContext) -> object:
            client = self._enter(context)
            try:
                return inner_unary(requests, context)
            finally:
                self._leave(client, context)

        return h._replace(stream_unary=stream_in)

    def _enter(self, context: grpc.ServicerContext) -> str:
        client = stream_client(context)
        with self._cond:
            if self._count + self._reserved >= self.limit:
                victim = self._victim(client)
                if victim is None:
                    self._refuse(context)
                wait = _Eviction()
                self._evicted[id(victim)] = wait
                event("stream_evicted", peer=victim.peer(), for_peer=context.peer())
                victim.cancel()  # its handler notices and ends; its slot is then held for this stream
                deadline = time.monotonic() + EVICTION_WAIT
                while not wait.freed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        wait.waiting = False  # the slot, once free, is everyone's
                        self._refuse(context)
                    self._cond.wait(min(left, 0.1))
                self._reserved -= 1
            self._count += 1
            self._open.setdefault(client, []).append(context)
        return client

    def _refuse(self, context: grpc.ServicerContext) -> NoReturn:
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"too many open streams on this server (limit {self.limit}); retry later",
        )
        raise AssertionError("ServicerContext.abort returned")

    def _victim(self, client: str) -> grpc.ServicerContext | None:
        """The stream `client` may cancel to get a slot: the newest of the biggest holder's, if that
        holder has at least two more (not counting streams already cancelled) than `client`. Called
        with the lock held."""
        live = {c: [x for x in xs if id(x) not in self._evicted] for c, xs in self._open.items()}
        mine = len(live.get(client, ()))
        biggest = max(live, key=lambda c: len(live[c]), default=None)
        if biggest is not None and len(live[biggest]) > mine + 1:
            return live[biggest][-1]
        return None

    def _leave(self, client: str, context: grpc.ServicerContext) -> None:
        with self._cond:
            streams = self._open.get(client, [])
            for i, x in enumerate(streams):
                if x is context:
                    del streams[i]
                    break
            if not streams:
                self._open.pop(client, None)
            self._count -= 1
            wait = self._evicted.pop(id(context), None)
            if wait is not None and wait.waiting:
                wait.freed = True
                self._reserved += 1
            self._cond.notify_all()


class _Eviction:
    """A stream waiting for the slot of the stream it cancelled (StreamCap)."""

    __slots__ = ("freed", "waiting")

    def __init__(self) -> None:
        self.freed = False
        self.waiting = True


def is_loopback(listen: str) -> bool:
    """Whether `listen` (HOST:PORT) binds only this machine: 127.0.0.0/8, ::1 or localhost."""
    host = listen.rpartition(":")[0].strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, empty (all interfaces), ...: assume the network can reach it
        return False


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
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A started gRPC server with health checking and reflection; Unavailable if it cannot listen.

    Streams of every kind are capped at `max_streams` (a quarter of `workers`
    if None), and the pool always has UNARY_HEADROOM threads beyond them; the
    server refuses calls beyond its threads with RESOURCE_EXHAUSTED rather
    than queueing them.
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
    server = grpc.server(
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpc"),
        interceptors=(StreamCap(streams),),
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
