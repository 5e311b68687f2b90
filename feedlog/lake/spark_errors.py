"""The feedlog error behind a failed Spark job, recovered on the driver.

A `FeedlogError` raised in a Python worker (a data source's reader or writer, a
writer's commit, a task of an RDD job) reaches the driver only as text: Spark
wraps the worker's traceback in its own exception (`[PYTHON_DATA_SOURCE_ERROR]
Failed to initialize Python data source writer: Traceback ...`, `Job aborted due
to stage failure: ... PythonException: ...`). Both ends of that text are ours:

- worker side, `marked` (a decorator on the data sources' and jobs' entry
  points) adds one line to the error as it leaves our code, an exception note
  that Python prints under the error in every traceback: `feedlog-error: {json}`
  with the kind, the class and the one-line message;
- driver side, `root_error` finds the LAST such line in the Spark exception's
  text (the outermost feedlog error: the one the task died of) and rebuilds the
  error; text from a worker that predates the marker falls back to the
  traceback's `feedlog.x.Kind: message` line, and anything else becomes
  `Unavailable("the Spark job failed: <the exception line>")`, never a traceback.

`spark_job()` wraps a driver-side Spark call for the CLI (raising the plain
feedlog error); `install()` (done by `feedlog.lake.spark_session` / `register`)
makes PySpark itself raise, for a failed action whose cause is a feedlog error,
an exception that is both that feedlog kind and the PySpark exception Spark
raised, whose message starts with the feedlog error's line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .. import errors

#: the worker-side line: `feedlog-error: {"kind": ..., "type": ..., "message": ...}` (one line: JSON escapes)
MARK = "feedlog-error: "
_MARK_AT = re.compile(re.escape(MARK) + r"(?=\{)")
#: a traceback's last line for one of our errors, when no marker came with it
_TRACEBACK_LINE = re.compile(r"^(feedlog(?:\.\w+)+)\.(\w+): (.*)$", re.MULTILINE)
_TRACEBACK_START = "Traceback (most recent call last):"
#: how much of Spark's own text a fallback message keeps
FIRST_LINE_LIMIT = 500

T = TypeVar("T")


# ---- worker side -------------------------------------------------------------------------------


def mark(err: errors.FeedlogError) -> errors.FeedlogError:
    """`err` with the marker line as an exception note (once); its type and message are unchanged."""
    notes = getattr(err, "__notes__", ())
    if not any(isinstance(n, str) and n.startswith(MARK) for n in notes):
        err.add_note(MARK + json.dumps(_describe(err), ensure_ascii=True))
    return err


def _describe(err: errors.FeedlogError) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": _kind(type(err)).__name__, "type": _path(type(err)), "message": str(err)}
    try:
        rebuilt = err.__reduce__()[1]  # StaleLength's current_length, ResourceExhausted's retry_after
        json.dumps(rebuilt)
        out["args"] = list(rebuilt)
    except (TypeError, ValueError, IndexError):
        pass
    return out


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _kind(cls: type[errors.FeedlogError]) -> type[errors.FeedlogError]:
    """The nearest class of `feedlog.errors` (what the exit code and retry advice follow)."""
    for c in cls.__mro__:
        if isinstance(c, type) and issubclass(c, errors.FeedlogError) and c.__module__ == errors.__name__:
            return c
    return errors.FeedlogError


def _marking(fn: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(fn, "__feedlog_marked__", False):
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            out = fn(*args, **kwargs)
        except errors.FeedlogError as e:
            mark(e)
            raise
        # a reader's read() returns an iterator that raises as the task consumes it, after we returned
        return _marked_iter(out) if inspect.isgenerator(out) or _is_plain_iterator(out) else out

    call.__feedlog_marked__ = True  # type: ignore[attr-defined]
    return call


def _is_plain_iterator(value: Any) -> bool:
    return isinstance(value, Iterator) and not isinstance(value, (str, bytes, list, tuple, dict))


def _marked_iter(it: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from it
    except errors.FeedlogError as e:
        mark(e)
        raise


def marked(*also: type) -> Callable[[T], T]:
    """Class (or function) decorator: every public method of the class, and of the classes in
    `also` (a data source's reader and writer classes, which workers import with it), adds the
    marker line to a feedlog error leaving it. Applied where the class is defined, so a worker
    that imports the module gets the marking methods too.

        @spark_errors.marked(FeedBatchReader, FeedStreamReader)
        class FeedDataSource(DataSource): ...
    """

    def apply(target: T) -> T:
        for cls in (target, *also):
            if isinstance(cls, type):
                _mark_class(cls)
        if not isinstance(target, type) and callable(target):
            return _marking(target)  # type: ignore[return-value]
        return target

    return apply


def _mark_class(cls: type) -> None:
    for name, value in list(vars(cls).items()):
        if (name.startswith("_") and name != "__init__") or not inspect.isfunction(value):
            continue
        setattr(cls, name, _marking(value))


# ---- driver side -------------------------------------------------------------------------------


def root_error(exc: BaseException) -> errors.FeedlogError:
    """The feedlog error a failed Spark job died of (the last one its text names), else Unavailable
    with the exception's first meaningful line."""
    own = getattr(exc, "feedlog_error", None)
    if isinstance(own, errors.FeedlogError):
        return own
    if isinstance(exc, errors.FeedlogError):
        return exc
    text = _text(exc)
    return find(text) or errors.Unavailable(f"the Spark job failed: {first_line(text, type(exc).__name__)}")


def find(text: str) -> errors.FeedlogError | None:
    """The last feedlog error named in a Spark exception's text: its marker line, else its traceback line."""
    found = None
    for m in _MARK_AT.finditer(text):
        try:
            desc, _end = json.JSONDecoder().raw_decode(text, m.end())
        except ValueError:
            continue
        if isinstance(desc, dict):
            found = _rebuild(desc) or found
    if found is not None:
        return found
    lines = _TRACEBACK_LINE.findall(text)
    if lines:
        module, name, message = lines[-1]
        return _rebuild({"type": f"{module}.{name}", "kind": name, "message": message.strip()})
    return None


def _rebuild(desc: dict[str, Any]) -> errors.FeedlogError | None:
    message = desc.get("message")
    if not isinstance(message, str):
        return None
    cls = _resolve(desc.get("type"))
    if cls is not None:
        args = desc.get("args")
        with contextlib.suppress(Exception):
            err = cls(*args) if isinstance(args, list) else cls(message)
            if str(err) == message:
                return err
        kind = _kind(cls)
    else:
        named = getattr(errors, str(desc.get("kind")), None)
        kind = named if isinstance(named, type) and issubclass(named, errors.FeedlogError) else errors.FeedlogError
    return kind(message)


def _resolve(path: Any) -> type[errors.FeedlogError] | None:
    """The class a dotted path names, for feedlog's own modules only."""
    if not isinstance(path, str) or not path.startswith("feedlog.") or "." not in path:
        return None
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name, None)
    except Exception:  # a module that will not import on this side: fall back to the kind
        return None
    return found if isinstance(found, type) and issubclass(found, errors.FeedlogError) else None


def _text(exc: BaseException) -> str:
    desc = getattr(exc, "_desc", None)  # PySpark's captured exceptions: their message without JVM calls
    if isinstance(desc, str):
        return desc
    try:
        return str(exc)
    except Exception:  # a Py4J error whose JVM is gone
        return repr(exc)


def first_line(text: str, default: str) -> str:
    """What to show of a Spark error that names no feedlog error: the Python exception line when it
    holds a worker's traceback (the line after the frames), else its first non-empty line."""
    at = text.rfind(_TRACEBACK_START)
    if at >= 0:
        for line in text[at + len(_TRACEBACK_START) :].splitlines():
            if line.strip() and not line.startswith((" ", "\t")):
                return line.strip()[:FIRST_LINE_LIMIT]
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), default)
    return line[:FIRST_LINE_LIMIT]


def is_spark_error(exc: BaseException) -> bool:
    """Whether `exc` came out of PySpark or Py4J (a failed job, a dead gateway), not our own code."""
    return any(c.__module__.split(".")[0] in ("pyspark", "py4j") for c in type(exc).__mro__)


@contextlib.contextmanager
def spark_job() -> Iterator[None]:
    """Driver-side Spark calls inside raise the plain feedlog error a failed job died of."""
    try:
        yield
    except errors.FeedlogError as e:
        own = getattr(e, "feedlog_error", None)
        if isinstance(own, errors.FeedlogError):  # install()'s combined error: the CLI wants just ours
            raise own from None
        raise
    except Exception as e:
        if is_spark_error(e):
            raise root_error(e) from None
        raise


# ---- PySpark's own exceptions ------------------------------------------------------------------

_COMBINED: dict[tuple[type, type], type] = {}


def combined(exc: Exception, root: errors.FeedlogError) -> Exception:
    """An exception that is both `root`'s class and `exc`'s (so `except SchemaMismatch` and
    `except AnalysisException` both catch it), whose message is root's line, then Spark's text."""
    key = (type(root), type(exc))
    cls = _COMBINED.get(key)
    if cls is None:
        try:
            cls = type(type(root).__name__, key, {"__str__": _combined_str, "__module__": type(root).__module__})
        except TypeError:  # layouts that cannot be combined: Spark's exception alone, message first
            cls = None
        if cls is not None:
            cls.__qualname__ = type(root).__qualname__
            _COMBINED[key] = cls
    out: Exception = Exception.__new__(cls) if cls is not None else exc
    out.__dict__.update(exc.__dict__)
    out.__dict__.update(root.__dict__)
    out.args = (str(root),)
    out.feedlog_error = root  # type: ignore[attr-defined]
    out.spark_exception = exc  # type: ignore[attr-defined]
    out.__feedlog_text__ = f"{root}\n\nfrom the Spark job: {_text(exc)}"  # type: ignore[attr-defined]
    if cls is None:
        out._desc = out.__feedlog_text__  # type: ignore[attr-defined]
    return out


def _combined_str(self: Any) -> str:
    return str(self.__feedlog_text__)


def install() -> None:
    """Make Py4J calls (every PySpark action) raise `combined` errors for failures caused by a
    feedlog error. Idempotent.

    The hook sits under PySpark's own handler, in the function PySpark wraps (`py4j.protocol`'s), not
    beside it: PySpark re-installs its handler whenever it builds a session object, which it does for
    every `foreachBatch` micro-batch and for `getActiveSession()` on a new thread, and a hook beside it
    was lost there (a streaming query's foreachBatch was enough to turn a `SchemaMismatch` back into
    a bare AnalysisException). Every re-install now wraps ours again."""
    import py4j.protocol  # type: ignore[import-untyped]
    from pyspark.errors.exceptions.captured import UnknownException, convert_exception, install_exception_handler

    current = py4j.protocol.get_return_value
    if not getattr(current, "__feedlog_hook__", False):

        @functools.wraps(current)
        def get_return_value(*args: Any, **kwargs: Any) -> Any:
            try:
                return current(*args, **kwargs)
            except py4j.protocol.Py4JJavaError as e:
                try:  # the exception PySpark's handler would raise for it, as the other half of ours
                    converted: Exception | None = convert_exception(e.java_exception)
                except Exception:  # a JVM that is gone
                    converted = None
                exc = e if converted is None or isinstance(converted, UnknownException) else converted
                root = find(_text(exc))
                if root is None:
                    raise
                raise combined(exc, root) from None

        get_return_value.__feedlog_hook__ = True  # type: ignore[attr-defined]
        py4j.protocol.get_return_value = get_return_value
    install_exception_handler()  # PySpark's, now around ours (it wraps py4j.protocol's function)
