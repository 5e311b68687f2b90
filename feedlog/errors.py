"""The one exception tree of the library.

A few coarse kinds, each telling the caller what to do about it (SlateDB's
style): fix the input, look elsewhere, stop trusting the data, re-read and
retry, or just retry later. `EXIT_CODES` below maps them to the exit codes of the
`feedlog` command (and of `python -m feedlog_server`), `feedlog.rpc` to gRPC
status codes: one place each.
"""

from __future__ import annotations

import re


class FeedlogError(Exception):
    """Root of every error feedlog raises on purpose."""

    #: whether repeating the same call unchanged can succeed
    retryable: bool = False


class InvalidArgument(FeedlogError):
    """The caller asked for something malformed or impossible; fix the input."""


class NotFound(FeedlogError):
    """The feed, table, key or seq does not exist (here)."""


class BeforeRetainedHistory(NotFound):
    """A version or time older than what the table still keeps: its log was cleaned up (or, for
    `BeforeHorizon`, its data files may have been vacuumed). Not corruption: a table forgets on purpose."""


class BeforeHorizon(BeforeRetainedHistory):
    """A version some of whose files vacuum may have deleted (older than the table's
    `delta.deletedFileRetentionDuration`): refused whole, never answered in part. `horizon_ms` is the
    oldest commit time still guaranteed readable."""

    def __init__(self, message: str, horizon_ms: int) -> None:
        super().__init__(message)
        self.horizon_ms = horizon_ms

    def __reduce__(self) -> tuple[type[BeforeHorizon], tuple[str, int]]:
        return type(self), (str(self), self.horizon_ms)


class AlreadyExists(FeedlogError):
    """Creating something that is already there."""


class Corruption(FeedlogError):
    """Stored or received data failed an integrity check (hash, checksum)."""


class SignatureError(Corruption):
    """A signature does not verify against the feed's public key."""


class Fork(Corruption):
    """The feed's key holder signed two different trees for the same length (or a different fork number).

    Neither copy is damaged; the writer equivocated, so no copy can simply be
    continued from the other. Raised with both tree hashes named.
    """


class Conflict(FeedlogError):
    """Someone else changed the state first (a lost race, a stale length)."""


class StaleLength(Conflict):
    """An append expected a length the feed no longer has: someone appended first. Re-read from
    `current_length` and sign again (appending anyway would fork the feed)."""

    def __init__(self, message: str, current_length: int) -> None:
        super().__init__(message)
        self.current_length = current_length

    def __reduce__(self) -> tuple[type[StaleLength], tuple[str, int]]:
        return type(self), (str(self), self.current_length)


class ReadOnly(FeedlogError):
    """Writing needs the feed's secret key, which this copy does not hold."""


class PermissionDenied(FeedlogError):
    """The caller lacks the credential this needs (e.g. a managed table's owner token)."""


class Unauthenticated(PermissionDenied):
    """The call needs credentials (a write token, a client certificate) and none came with it."""


class Unsupported(FeedlogError):
    """Valid data that needs a capability this version of feedlog lacks (e.g. a Delta table feature)."""


class Unavailable(FeedlogError):
    """A transient failure (I/O, network); retrying later can help."""

    retryable = True


class ResourceExhausted(Unavailable):
    """The caller is over a rate or capacity limit; retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[type[ResourceExhausted], tuple[str, float]]:
        return type(self), (str(self), self.retry_after)


#: the exit code of each kind (most specific first); 1 for anything else
EXIT_CODES: tuple[tuple[type[FeedlogError], int], ...] = (
    (InvalidArgument, 2),
    (NotFound, 3),
    (AlreadyExists, 4),
    (Corruption, 5),  # SignatureError and Fork too
    (Conflict, 6),
    (ReadOnly, 7),
    (PermissionDenied, 7),
    (Unavailable, 8),
    (Unsupported, 9),
)


def exit_code(err: FeedlogError) -> int:
    for kind, code in EXIT_CODES:
        if isinstance(err, kind):
            return code
    return 1


#: characters a terminal acts on (C0 but tab, DEL, C1, line and paragraph separators) or that reorder
#: how a line shows (bidirectional marks, embeddings, overrides and isolates), as escapes
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character escaped (a newline as \\n, an ESC as \\x1b): text from a
    peer or a file shown as one line, which can neither forge lines nor move the cursor."""
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)


def shorten(value: object, limit: int = 200) -> str:
    """`repr`-free text of an input for an error message, at most about `limit` characters.

    Errors echo what the caller sent so the caller can see its mistake; a
    hostile or broken caller can send megabytes, which would then be copied
    into logs and into gRPC status details (whose size limit turns the answer
    into an opaque RESOURCE_EXHAUSTED).
    """
    text = str(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}...({len(text)} characters)...{text[-20:]}"
