"""The console's web pages: routes, templates and the rules every response follows.

Starlette routes GET (and HEAD) only; each page calls `reads` and renders one Jinja2 template
with autoescape on for every template. Every response carries a strict Content-Security-Policy
(no script at all, styles from this server only, pictures from it or `data:`, no framing),
`X-Content-Type-Options: nosniff` and no-store caching: the pages show strangers' keys and
values (issue 39, "It faces strangers' data"). A request with another method is 405 before any
route runs; with tokens configured, one without a matching token is 401 (HTTP Basic with the
token as password, so a browser asks for it with no script; or `Authorization: Bearer TOKEN`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import math
import sys
import traceback
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from ..clock import Clock, SystemClock
from ..errors import FeedlogError, InvalidArgument, NotFound, ResourceExhausted, printable
from ..log.timestamps import format_duration, format_iso_ms
from . import reads
from .catalog import Catalog

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: no script runs, nothing loads from elsewhere, no page frames these (clickjacking), no form posts
CSP = (
    "default-src 'none'; script-src 'none'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
METHODS = ("GET", "HEAD")
#: the longest text of a stranger's shown in one cell (the rest is elided, with the length said)
SHOWN = 300
log = logging.getLogger("feedlog.console")


# ---- what a template may do with a stranger's text ---------------------------------------------------


def shown(value: object, limit: int = SHOWN) -> str:
    """Text for a page: control, bidi and line-separator characters made visible escapes (they can
    neither reorder nor forge what is around them), long text elided. Escaping for HTML is
    Jinja2's (autoescape); this is what escaping cannot do."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text):,} characters)"
    return printable(text)


def hex_text(value: str | None, limit: int = SHOWN) -> str:
    """A value as `cat` shows it: UTF-8 text if it is printable, else 0x and its hex."""
    if value is None:
        return "-"
    raw = bytes.fromhex(value)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return shown("0x" + value, limit)
    return shown(text, limit) if text.isprintable() else shown("0x" + value, limit)


def iso(ms: int | None) -> str:
    """ms since the epoch as ISO-8601 UTC (untrusted values, 1970 or far future, as they are)."""
    return format_iso_ms(ms)


def duration(ms: int | None) -> str:
    return "-" if ms is None else format_duration(ms)


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("feedlog.console", "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(shown=shown, hex_text=hex_text, iso=iso, duration=duration)
    env.globals["json_text"] = lambda v: json.dumps(v, indent=2, sort_keys=True, ensure_ascii=True)
    return env


# ---- the rules of every response ---------------------------------------------------------------------


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def presented_token(authorization: str) -> str | None:
    """The token in an Authorization header: Bearer TOKEN, or Basic with the token as password."""
    kind, _, rest = authorization.strip().partition(" ")
    if kind.lower() == "bearer":
        return rest.strip() or None
    if kind.lower() == "basic":
        try:
            decoded = base64.b64decode(rest.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return None


def authorized(hashes: Sequence[bytes], authorization: str | None) -> bool:
    """Whether the header carries one of the tokens (compared as SHA-256 digests, in constant time)."""
    token = presented_token(authorization) if authorization else None
    if token is None:
        return False
    got = token_digest(token)
    return any(hmac.compare_digest(got, h) for h in hashes)


class Guard:
    """ASGI middleware: GET/HEAD only, the token if any, and the security headers on every answer."""

    def __init__(self, app: ASGIApp, token_hashes: Sequence[bytes] = ()) -> None:
        self.app = app
        self.token_hashes = list(token_hashes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: nothing to guard
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in HEADERS if h[0] not in names)]
            await send(message)

        if scope["method"] not in METHODS:
            await _plain(with_headers, 405, "read-only: GET and HEAD only\n", [(b"allow", b"GET, HEAD")])
            return
        if self.token_hashes:
            auth = next(
                (v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"authorization"), None
            )
            if not authorized(self.token_hashes, auth):
                realm = [(b"www-authenticate", b'Basic realm="feedlog console", charset="UTF-8"')]
                await _plain(with_headers, 401, "a token is needed: any user name, the token as password\n", realm)
                return
        await self.app(scope, receive, with_headers)


async def _plain(send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# ---- the pages -------------------------------------------------------------------------------------


def _int_arg(request: Request, name: str, default: int | None = None) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not text.isdigit() or len(text) > 18:
        raise InvalidArgument(f"?{name}= takes a whole number")
    return int(text)


STATUS = {"NotFound": 404, "InvalidArgument": 400, "PermissionDenied": 403, "Unavailable": 503}


def create_app(catalog: Catalog, *, token_hashes: Sequence[bytes] = (), clock: Clock | None = None) -> ASGIApp:
    """The console over `catalog` (see the module docstring); `token_hashes`: SHA-256 of the tokens
    a request must carry (none: open, for a loopback listener)."""
    env = environment()
    clock = clock or SystemClock()
    css = resources.files("feedlog.console").joinpath("static/console.css").read_bytes()

    def render(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        html = env.get_template(name).render(catalog=catalog, **ctx)
        return HTMLResponse(html, status_code=status)

    def page(fn: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """A sync endpoint (Starlette runs it in its bounded thread pool) whose feedlog errors are
        an error page with their message, escaped; any other failure a page that says only that."""

        def run(request: Request) -> Response:
            try:
                return fn(request)
            except FeedlogError as e:
                kind = next((c.__name__ for c in type(e).__mro__ if c.__name__ in STATUS), "")
                response = render("error.html", STATUS.get(kind, 502), message=str(e), kind=type(e).__name__)
                if isinstance(e, ResourceExhausted):  # a heavy page's gate is full (reads.Gate)
                    response.headers["retry-after"] = str(max(1, math.ceil(e.retry_after)))
                return response
            except Exception:
                traceback.print_exc(file=sys.stderr)
                return render("error.html", 500, message="internal error (the console's log has the details)", kind="")

        return run

    @page
    def feeds(request: Request) -> Response:
        offset = _int_arg(request, "offset", 0) or 0
        size = reads.page_size(_int_arg(request, "size"), reads.PAGE)
        rows = []
        for ref in catalog.feeds[offset : offset + size]:
            try:
                rows.append(reads.feed_summary(ref))
            except FeedlogError as e:  # one unreachable peer does not hide the others
                rows.append({"index": ref.index, "name": ref.name, "key": ref.source.key_hex, "error": str(e)})
        more = offset + size < len(catalog.feeds)
        return render("feeds.html", rows=rows, offset=offset, size=size, more=more, now=clock.now_ms())

    @page
    def feed(request: Request) -> Response:
        ref = catalog.feed(int(request.path_params["n"]))
        size = reads.page_size(_int_arg(request, "size"))
        summary = reads.feed_summary(ref)
        entries = reads.entries_page(ref, _int_arg(request, "before"), size, clock.now_ms())
        every = request.query_params.get("every", "1h")
        try:
            act: dict[str, Any] | None = reads.activity(ref, every, clock.now_ms())
            act_error = None
        except FeedlogError as e:
            act, act_error = None, str(e)
        return render(
            "feed.html",
            ref=ref,
            info=summary,
            page=entries,
            size=size,
            activity=act,
            activity_error=act_error,
            every=every,
        )

    @page
    def activity_svg(request: Request) -> Response:
        ref = catalog.feed(int(request.path_params["n"]))
        svg = reads.activity_svg(ref, request.query_params.get("every", "1h"), clock.now_ms())
        return Response(svg, media_type="image/svg+xml")

    @page
    def entry(request: Request) -> Response:
        ref = catalog.feed(int(request.path_params["n"]))
        seq = int(request.path_params["seq"])
        row = reads.entry(ref, seq, clock.now_ms())
        return render("entry.html", ref=ref, row=row, seq=seq)

    @page
    def proof(request: Request) -> Response:
        ref = catalog.feed(int(request.path_params["n"]))
        seq = int(request.path_params["seq"])
        doc = reads.proof(ref, seq)
        name = f"feedlog-proof-{ref.source.key_hex[:16]}-{seq}.json"
        return Response(
            json.dumps(doc, separators=(",", ":")) + "\n",
            media_type="application/json",
            headers={"content-disposition": f'attachment; filename="{name}"'},
        )

    @page
    def key_history(request: Request) -> Response:
        ref = catalog.feed(int(request.path_params["n"]))
        key = request.query_params.get("key")
        if key is None:
            raise InvalidArgument("?key= names the key")
        return render("key.html", ref=ref, history=reads.key_history(ref, key, clock.now_ms()))

    @page
    def tables(request: Request) -> Response:
        return render("tables.html")

    @page
    def table(request: Request) -> Response:
        ref = catalog.table(int(request.path_params["n"]))
        size = reads.page_size(_int_arg(request, "size"), reads.PAGE)
        offset = _int_arg(request, "offset", 0) or 0
        return render("table.html", ref=ref, t=reads.table_page(catalog, ref, offset, size), size=size)

    @page
    def commit(request: Request) -> Response:
        ref = catalog.table(int(request.path_params["n"]))
        return render("commit.html", ref=ref, c=reads.commit(catalog, ref, int(request.path_params["v"])))

    @page
    def audit(request: Request) -> Response:
        ref = catalog.table(int(request.path_params["n"]))
        return render("audit.html", ref=ref, a=reads.audit(catalog, ref))

    def stylesheet(request: Request) -> Response:
        return Response(css, media_type="text/css", headers={"cache-control": "max-age=300"})

    def home(request: Request) -> Response:
        return RedirectResponse("/feeds" if catalog.feeds or not catalog.tables else "/tables", status_code=303)

    @page
    def missing(request: Request) -> Response:
        raise NotFound("no such page")

    get = list(METHODS)
    routes = [
        Route("/", home, methods=get),
        Route("/feeds", feeds, methods=get),
        Route("/feeds/{n:int}", feed, methods=get),
        Route("/feeds/{n:int}/activity.svg", activity_svg, methods=get),
        Route("/feeds/{n:int}/keys", key_history, methods=get),
        Route("/feeds/{n:int}/entries/{seq:int}", entry, methods=get),
        Route("/feeds/{n:int}/entries/{seq:int}/proof.json", proof, methods=get),
        Route("/tables", tables, methods=get),
        Route("/tables/{n:int}", table, methods=get),
        Route("/tables/{n:int}/commits/{v:int}", commit, methods=get),
        Route("/tables/{n:int}/audit", audit, methods=get),
        Route("/static/console.css", stylesheet, methods=get),
        Route("/{rest:path}", missing, methods=get),
    ]
    return Guard(Starlette(routes=routes), token_hashes)
