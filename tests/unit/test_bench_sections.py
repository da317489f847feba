"""``python -m bench --sections``: a section measured again on its own, into an earlier
result, and the report saying when."""

from __future__ import annotations

import pytest

from bench.__main__ import parse
from bench.report.template_values import _when


def test_sections_are_the_benchs_own_and_go_into_an_earlier_result(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    _, args = parse(["--sections", "freshness,writers", "--out", str(tmp_path)])
    assert args.sections == ("freshness", "writers")
    _, args = parse([])
    assert args.sections is None
    for argv in (["--sections", "freshness,warp", "--out", str(tmp_path)],
                 ["--sections", "freshness", "--out", str(tmp_path / "none")]):
        with pytest.raises(SystemExit) as refused:
            parse(argv)
        assert refused.value.code == 2


def test_a_section_measured_again_says_when():
    assert _when({"runs": []}) == ""
    text = _when({"measured_at": "2026-11-30T22:05:01+00:00", "load_start": [1.5, 2.0, 2.5]})
    assert "again on its own" in text and "2026-11-30 22:05 UTC" in text
    assert "[1.5, 2.0, 2.5]" in text
