"""Errors with a meaning for the exit code, and DSN redaction for every message and log line.

- ``UserError``: something the person running lakecdc can fix (bad DSN, wrong ``wal_level``,
  missing slot...). The CLI prints its one sentence and exits 2, with no traceback.
- ``DriftFound``: verification found gold or the dashboard different from the source: exit 1.

``redact`` takes passwords out of any text; ``first_line`` / ``last_line`` give one line of an
exception's text, redacted, for a sentence or a log line.
"""

from __future__ import annotations

import re


class UserError(Exception):
    """A configuration or usage problem; the message says what to do. Exit code 2."""


class DriftFound(Exception):
    """Verification found a difference from the source. Exit code 1."""


_URI_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)([^@\s]*)(@)")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact(text: str) -> str:
    """Replace passwords in any DSN inside ``text`` with ``***``."""
    text = _URI_PASSWORD.sub(r"\1***\3", text)
    return _KV_PASSWORD.sub(r"\1***", text)


def _lines(exc: BaseException) -> list[str]:
    return [ln.strip() for ln in redact(str(exc)).splitlines() if ln.strip()]


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s text, passwords redacted (its type's name if empty)."""
    lines = _lines(exc)
    return lines[0] if lines else type(exc).__name__


def last_line(exc: BaseException) -> str:
    """The last line of ``exc``'s text, passwords redacted: where libpq puts why a
    connection failed (its type's name if empty)."""
    lines = _lines(exc)
    return lines[-1] if lines else type(exc).__name__
