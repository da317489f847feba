"""bench.stages: a probe placed on the timeline of the shipper's and the stream's batches."""

from types import SimpleNamespace

import pytest

from bench.stages import STAGES, StageClock


def _clock(ships, passes) -> StageClock:
    """``ships``: (start, seconds); ``passes``: (start, seconds, parse_s, ahead_done_s)."""
    clock = StageClock()
    for start, seconds in ships:
        clock.ships.append(_span(start, seconds))
    for start, seconds, parse, done in passes:
        clock.on_pass(SimpleNamespace(input_rows=1, started_at=start, seconds=seconds,
                                      parse_seconds=parse, ahead_done_seconds=done))
    return clock


def _span(start, seconds):
    from bench.stages import _Span
    return _Span(start, start + seconds)


def test_a_commit_after_a_batch_fixed_its_input_is_carried_by_the_next_batch():
    # Probe at 10.0; the peek begun at 10.1 carries it, bronze commit at 10.2. The stream
    # batch begun at 10.25 had fixed its input before that commit: it shows at 10.35, yet
    # the probe is seen at 10.83, just after the next batch (begun 10.7) showed its rows.
    clock = _clock(ships=[(9.8, 0.1), (10.1, 0.1), (10.4, 0.1)],
                   passes=[(10.25, 0.2, 0.05, 0.1), (10.7, 0.2, 0.05, 0.1)])
    stages = clock.place(10.0, 0.83)
    assert stages["poll_wait"] == pytest.approx(0.1)
    assert stages["ship"] == pytest.approx(0.1)
    assert stages["stream_trigger"] == pytest.approx(0.5)     # 10.2 → 10.7
    assert stages["parse"] == pytest.approx(0.05)
    assert stages["gold_push"] == pytest.approx(0.05)
    assert stages["seen"] == pytest.approx(0.03)
    assert sum(stages[s] for s in STAGES) == pytest.approx(0.83)


def test_a_peek_begun_just_before_the_commit_returned_may_carry_it():
    # The peek begun at 9.98 carried a probe whose commit returned at 10.0: the next peek
    # (10.3) ended after the stream batch that showed the probe had begun.
    clock = _clock(ships=[(9.98, 0.07), (10.3, 0.1)], passes=[(10.1, 0.2, 0.05, 0.1)])
    stages = clock.place(10.0, 0.22)
    assert stages["poll_wait"] == 0.0
    assert stages["ship"] == pytest.approx(0.07)
    assert stages["stream_trigger"] == pytest.approx(0.05)


def test_breakdown_reports_each_stage_and_a_probe_nothing_carried_is_left_out():
    clock = _clock(ships=[(10.1, 0.1)], passes=[(10.3, 0.2, 0.05, 0.1)])
    out = clock.breakdown([(10.0, 0.45), (50.0, 0.4)])
    assert (out["probes"], out["placed"]) == (2, 1)
    assert out["stream_trigger"]["p50"] == pytest.approx(0.1)
    assert out["seen"]["p50"] == pytest.approx(0.05)
    assert out["batches_pushed_ahead"] == 1


def test_a_probe_the_shipper_batch_showed_ahead_of_the_stream_has_no_stream_stages():
    # The peek begun at 10.1 carried the probe: in bronze at 10.2, its step on the dashboard
    # 0.02 s later, ahead of the stream batch begun at 10.3 (which then found the dashboard
    # past it). Seen at 10.26.
    clock = _clock(ships=[(9.8, 0.1)], passes=[(10.3, 0.2, 0.05, 0.0)])
    clock.on_ship(SimpleNamespace(committed=True, changes=5, started_at=10.1, seconds=0.1,
                                  ahead_seconds=0.02), None)
    stages = clock.place(10.0, 0.26)
    assert stages["shipped_ahead"]
    assert stages["poll_wait"] == pytest.approx(0.1)
    assert stages["ship"] == pytest.approx(0.1)
    assert stages["ship_ahead"] == pytest.approx(0.02)
    assert stages["stream_trigger"] == stages["parse"] == stages["gold_push"] == 0.0
    assert stages["seen"] == pytest.approx(0.04)
    assert sum(stages[s] for s in STAGES) == pytest.approx(0.26)
    # A shipper batch whose step did not go ahead leaves the probe to the stream batch.
    clock.ships[-1] = _span(10.1, 0.1)
    assert not clock.place(10.0, 0.55)["shipped_ahead"]
