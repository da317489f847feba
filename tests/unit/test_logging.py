"""Log formats and password redaction, through the real CLI entry point (``main``).

Redaction is checked on what reaches stderr: log messages, their arguments (strings and
exceptions), ``extra`` fields, tracebacks logged with ``exc_info``, and the CLI's own error
paths - a ``UserError`` (exit 2) and an unexpected failure with its traceback (exit 3) - in
the text and the JSON format. No Postgres: the exit-2 case is a real connection refused.
"""

from __future__ import annotations

import json
import logging
import socket
import warnings

import click
import pytest

from pipelines import cli as cli_module
from pipelines.cli import main
from pipelines.observe.logs import configure_logging

SECRET = "s3cr3t-Pa55"
URI_DSN = f"postgresql://lakecdc:{SECRET}@127.0.0.1:{{port}}/notify"
KV_DSN = f"host=127.0.0.1 port=5 dbname=notify user=lakecdc password={SECRET}"


@pytest.fixture(autouse=True)
def restore_logging():
    own, root = logging.getLogger("lakecdc"), logging.getLogger()
    saved = (own.handlers[:], own.level, own.propagate, root.handlers[:])
    yield
    own.handlers[:], own.level, own.propagate = saved[:3]
    root.handlers[:] = saved[3]
    logging.captureWarnings(False)


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_everything(dsn: str) -> None:
    log = logging.getLogger("lakecdc.test")
    log.info("connecting to %s", dsn)                                   # str argument
    log.warning("failed: %s", ConnectionError(f"cannot reach {dsn}"))   # non-str argument
    log.info("message with the DSN inline: " + dsn)
    log.info("with extra", extra={"dsn": dsn, "rows": 3, "layer": "bronze"})
    try:
        raise RuntimeError(f"boom at {dsn}")
    except RuntimeError:
        log.exception("traceback follows")
    logging.getLogger("some.library").warning("third-party warning about %s", dsn)
    log.debug("debug line %s", dsn)


@pytest.mark.parametrize("dsn", [URI_DSN.format(port=5), KV_DSN])
def test_text_logs_redact_passwords_everywhere(capsys, dsn):
    configure_logging(verbose=True, log_format="text")
    _log_everything(dsn)
    err = capsys.readouterr().err
    assert SECRET not in err
    assert err.count("***") == 6          # every line but the one whose DSN is in `extra`
    assert "lakecdc.test INFO connecting to" in err
    assert "Traceback (most recent call last)" in err and "RuntimeError: boom at" in err
    assert "third-party warning" in err and "debug line" in err


@pytest.mark.parametrize("dsn", [URI_DSN.format(port=5), KV_DSN])
def test_json_logs_are_one_object_per_line_and_redacted(capsys, dsn):
    configure_logging(verbose=False, log_format="json")
    _log_everything(dsn)
    warnings.warn(f"a Python warning mentioning {dsn}", UserWarning, stacklevel=1)
    err = capsys.readouterr().err
    assert SECRET not in err
    records = [json.loads(line) for line in err.splitlines()]     # every line is JSON
    by_message = {r["message"].split(" ")[0]: r for r in records}
    assert {"ts", "level", "logger", "message"} <= set(records[0])
    assert records[0]["ts"].endswith("Z") and records[0]["level"] == "INFO"
    assert records[0]["logger"] == "lakecdc.test" and "***" in records[0]["message"]
    extra = by_message["with"]
    assert extra["rows"] == 3 and extra["layer"] == "bronze" and "***" in extra["dsn"]
    failure = by_message["traceback"]
    assert failure["level"] == "ERROR"
    assert "RuntimeError: boom at" in failure["exception"] and "***" in failure["exception"]
    assert by_message["third-party"]["logger"] == "some.library"
    assert any(r["logger"] == "py.warnings" and "***" in r["message"] for r in records)
    assert not any(r["message"].startswith("debug line") for r in records)   # not verbose


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_user_error_exit_2_does_not_show_the_password(capsys, closed_port, fmt):
    code = main(["--log-format", fmt, "--source-dsn", URI_DSN.format(port=closed_port),
                 "status"])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot connect to the source database postgresql://lakecdc:***@" in err
    assert SECRET not in err


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_unexpected_failure_exit_3_traceback_is_redacted(capsys, monkeypatch, fmt):
    dsn = URI_DSN.format(port=5)

    @click.command("explode")
    def explode():
        logging.getLogger("lakecdc.test").error("about to fail on %s", dsn)
        raise RuntimeError(f"unexpected failure talking to {dsn} (or {KV_DSN})")

    monkeypatch.setitem(cli_module.cli.commands, "explode", explode)
    monkeypatch.setenv("LAKECDC_LOG_FORMAT", fmt)      # the environment variable works too
    code = main(["explode"])
    err = capsys.readouterr().err
    assert code == 3
    assert "Traceback (most recent call last)" in err
    assert "RuntimeError: unexpected failure talking to postgresql://lakecdc:***@" in err
    assert "password=***" in err
    assert SECRET not in err
    log_line = next(line for line in err.splitlines() if "about to fail" in line)
    redacted = "about to fail on postgresql://lakecdc:***@127.0.0.1:5/notify"
    assert (json.loads(log_line)["message"] if fmt == "json" else log_line).endswith(redacted)


def test_unknown_log_format_is_a_usage_error(capsys):
    assert main(["--log-format", "xml", "status"]) == 2
    assert "xml" in capsys.readouterr().err


def test_logs_follow_stderr_when_it_is_swapped_after_configuring(monkeypatch):
    """Commands run in one process (the tests, a notebook) see ``sys.stderr`` swapped
    between them; a handler bound to the first stream would write to a closed file."""
    import io

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    configure_logging(verbose=False)
    logging.getLogger("lakecdc.test").info("to the first")
    first.close()
    monkeypatch.setattr("sys.stderr", second)
    logging.getLogger("lakecdc.test").info("to the second")
    logging.getLogger("other.library").warning("a warning too")
    lines = second.getvalue().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "lakecdc.test INFO to the second", "other.library WARNING a warning too"], lines
