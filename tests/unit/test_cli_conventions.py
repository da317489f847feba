"""The shell's conventions: ``--version``, ``status``' exit codes, ``--json`` documents."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
from dataclasses import dataclass

import pytest

from pipelines.cli.context import echo_json
from pipelines.cli.main import main
from pipelines.observe.status import LAYER_EMPTY, SLOT_MISSING, exit_code
from pipelines.setup.capture import TableLine, tables_json


def test_version_prints_the_installed_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"lakecdc {importlib.metadata.version('lakecdc')}"


def report(slot: str | None = "reserved", notes=("", "", "", "")) -> dict:
    return {"slot": None if slot is None else {"wal_status": slot},
            "layers": [{"layer": name, "note": note}
                       for name, note in zip(("bronze", "silver", "gold", "dashboard"), notes)]}


@pytest.mark.parametrize("state,code", [
    (report(), 0),
    (report(slot="extended"), 0),
    (report(slot=None), SLOT_MISSING),
    (report(slot="lost"), SLOT_MISSING),
    (report(slot=None, notes=("not created yet",) * 4), SLOT_MISSING),
    (report(notes=("", "not created yet", "", "")), LAYER_EMPTY),
    (report(notes=("", "", "", "nothing pushed yet")), LAYER_EMPTY),
])
def test_status_exits_by_what_it_found(state, code):
    assert exit_code(state) == code
    assert (SLOT_MISSING, LAYER_EMPTY) == (4, 5)       # documented in README and main


def test_json_documents_carry_dataclasses_times_and_lsns(capsys):
    @dataclass
    class Report:
        table: str
        seconds: float

    at = dt.datetime(2026, 12, 7, 9, 0, tzinfo=dt.timezone.utc)
    echo_json([Report("gold", 0.5), {"at": at}])
    assert json.loads(capsys.readouterr().out) == [{"table": "gold", "seconds": 0.5},
                                                    {"at": "2026-12-07T09:00:00+00:00"}]
    line = TableLine("public.notifications", "captured", at, 3, at, at, ((1 << 32) + 16, at))
    assert tables_json([line])[0]["complete_as_of"] == {"commit_lsn": "1/10", "commit_ts": at}


def test_each_extra_is_named_in_one_sentence():
    """A command whose extra is not installed names it (``core.extras``); the sentence for
    Spark is the one the commands gave before the other extras existed."""
    from core.errors import UserError
    from core.extras import EXTRAS, missing, require

    assert missing("spark") == ("this command runs Spark, which is not installed here: "
                                "install it with pip install 'lakecdc[spark]' (a Databricks "
                                "runtime brings its own).")
    for extra in EXTRAS:
        assert f"pip install 'lakecdc[{extra}]'" in missing(extra)
    require("spark")                             # installed in the test environment
    EXTRAS["absent"] = (("no_such_module_here",), "this needs nothing real")
    try:
        with pytest.raises(UserError, match=r"lakecdc\[absent\]"):
            require("absent")
    finally:
        del EXTRAS["absent"]
