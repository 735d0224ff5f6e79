"""Structured logs: one JSON object a line (structlog), UTC times to the millisecond.

The code logs through the standard library (`log.info("...", extra={...})`); structlog renders
every record, the app's and its libraries', as JSON. What a delivery is about (`delivery_id`,
`installation_id`, `event`, `action`) is bound in a context variable by the worker, so every
line logged while the delivery is handled carries it, the forge layer's included, and each
line keeps its own fields beside them.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import time
from collections.abc import Iterator, MutableMapping
from typing import Any

import orjson
import structlog
from structlog.contextvars import bound_contextvars, merge_contextvars

from bot import jsontext
from bot.unseen import UNSEEN

LEVELS = ("debug", "info", "warning", "error", "critical")


# the last second stamped and its text: one tuple, read and replaced whole (threads log too)
_second: tuple[int, str] = (-1, "")


def _utc_millis(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    global _second
    now = time.time()
    second, text = _second
    if int(now) != second:  # strftime once a second, not once a line
        second = int(now)  # (what gmtime takes of it)
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second = second, text
    event["time"] = f"{text}.{int(now % 1 * 1000):03d}Z"
    return event


def _rename_event(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event["msg"] = event.pop("event", "")
    return event


# the attributes every LogRecord has: any other on a record is its `extra` (ExtraAdder's rule,
# made as structlog makes its own list: public names only, so an upgrade cannot take them away)
_RECORD_KEYS = frozenset(logging.LogRecord("name", 0, "pathname", 0, "msg", (), None).__dict__)


class _LineFormatter(structlog.stdlib.ProcessorFormatter):
    """The ProcessorFormatter below, with the lines the app logs (no exception, no stack, not
    structlog's own) written without its copy of each record and its chain of calls: the
    same steps on the same dict, in the same order, so the same line (keys in the same
    order). A line of another kind goes through the chain. A third of a line's cost, and the
    app logs two lines a delivery (intake's and the worker's)."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.stack_info or hasattr(record, "_logger"):
            return super().format(record)
        method = record.levelname.lower()
        # what ProcessorFormatter makes of a foreign record, `event` renamed (_rename_event)
        ed: dict[str, Any] = {"_record": record, "_from_structlog": False,
                              "msg": record.getMessage()}
        merge_contextvars(None, method, ed)
        structlog.stdlib.add_log_level(None, method, ed)
        ed["logger"] = record.name  # add_logger_name
        for key, value in record.__dict__.items():  # ExtraAdder
            if key not in _RECORD_KEYS:
                ed[key] = value
        _utc_millis(None, method, ed)
        del ed["_record"], ed["_from_structlog"]  # remove_processors_meta
        # (format_exc_info: only an `exc_info` bound in the context reaches it here)
        return _json_line(structlog.processors.format_exc_info(None, method, ed))


def _formatter() -> structlog.stdlib.ProcessorFormatter:
    return _LineFormatter(
        foreign_pre_chain=[
            _rename_event,  # first: `event` is the webhook's event name in these lines
            merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(),
            _utc_millis,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_json_line),
        ],
    )


_AS_BEFORE = (orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS
              | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS)


# what orjson writes raw that a terminal showing the log (`up`'s stderr) may act on: DEL, and
# C1 (U+0080-U+009F, CSI among them) in UTF-8; it escapes C0 itself. And what fools the eye
# there (a bidi override, a zero-width character: the ones `say` shows). A line all ASCII
# but DEL (most are) is not searched.
_RAW_CONTROL = re.compile(b"|".join([rb"\x7f", rb"\xc2[\x80-\x9f]",
                                     *(re.escape(chr(c).encode()) for c in UNSEEN)]))


def _escaped(control: re.Match[bytes]) -> bytes:
    return b"\\u%04x" % ord(control[0].decode())


def _json_line(value: Any, **_: Any) -> str:
    """A line's JSON, written by orjson (a third of a line's cost with json.dumps); dataclasses,
    datetimes and subclasses of str or int as `default=str` writes them; no control character
    left raw (the same text, every one escaped)."""
    line = jsontext.dumps(value, default=str, option=_AS_BEFORE)
    if b"\x7f" in line or not line.isascii():
        line = _RAW_CONTROL.sub(_escaped, line)
    return line.decode()


def setup_logging(level: str = "info") -> None:
    """JSON lines on stderr at `level` (debug, info, warning, error, critical)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "aiosqlite", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def lean_records() -> None:
    """For `serve`: what no line shows is not gathered (the logging HOWTO's "Optimization"):
    the caller's file and line (a walk up the stack per line; `stack_info` then shows
    nothing), the thread and the process."""
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


@contextlib.contextmanager
def delivery_context(**fields: Any) -> Iterator[None]:
    """Every line logged inside (by any module, in this task) carries `fields`."""
    with bound_contextvars(**fields):
        yield


class _Merging(logging.LoggerAdapter[logging.Logger]):
    """Adds its fields to a line's own `extra` instead of replacing it (the stdlib adapter's
    way), so a `refused` line keeps its `reason` and `issue`."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def bound(logger: logging.Logger, **fields: Any) -> logging.LoggerAdapter[logging.Logger]:
    """A logger that adds `fields` (delivery_id, installation_id, mail, ...) to every line."""
    return _Merging(logger, fields)
