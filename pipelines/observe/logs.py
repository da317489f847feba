"""lakecdc's log lines on stderr: text or one JSON object per line, passwords redacted in
both (``--log-format``, docs/observability.md)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys

from core.errors import redact


class _RedactingText(logging.Formatter):
    """The text format, redacted as a whole line: the message, its arguments (strings or
    not, e.g. an exception), ``extra`` fields and tracebacks alike."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


# LogRecord's own attributes; everything else on a record came from ``extra=``.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class _RedactingJson(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    ``thread`` outside the main thread, ``extra=`` fields, ``exception`` (the traceback).
    Every string value is redacted before it is serialised."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict = {k: v for k, v in vars(record).items()
                     if k not in _RECORD_FIELDS and not k.startswith("_")}
        out.update(ts=dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
                   .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                   level=record.levelname, logger=record.name, message=record.getMessage())
        if record.threadName != "MainThread":
            out["thread"] = record.threadName
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(_redacted(out), ensure_ascii=False)


def _redacted(value):
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): _redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_redacted(v) for v in value]
    return redact(str(value))


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record, not as it was when configured: a
    process that runs commands in-process (the tests, a notebook) may swap it between them,
    and a handler holding a closed stream loses every later line."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(verbose: bool, log_format: str = "text") -> None:
    """lakecdc's loggers at INFO (DEBUG with ``verbose``), other libraries' at WARNING, all
    to stderr through one redacting formatter: ``text`` or ``json`` (one object per line,
    Python warnings included)."""
    json_lines = log_format.lower() == "json"
    formatter = _RedactingJson() if json_lines else _RedactingText(
        "%(asctime)s %(name)s %(levelname)s %(message)s")

    def handler(level: int) -> logging.Handler:
        h = _Stderr()
        h.setLevel(level)
        h.setFormatter(formatter)
        h._lakecdc = True            # ours: replaced, not stacked, when configured again
        return h

    own = logging.getLogger("lakecdc")
    own.handlers[:] = [handler(logging.NOTSET)]
    own.setLevel(logging.DEBUG if verbose else logging.INFO)
    own.propagate = False
    # Other libraries' warnings would otherwise reach stderr unformatted and unredacted
    # (Python's last-resort handler).
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not getattr(h, "_lakecdc", False)]
    root.addHandler(handler(logging.WARNING))
    logging.captureWarnings(json_lines)
    # py4j reports Python exceptions raised inside Spark callbacks itself; lakecdc reports
    # them once, as its own errors.
    logging.getLogger("py4j").setLevel(logging.DEBUG if verbose else logging.CRITICAL)
