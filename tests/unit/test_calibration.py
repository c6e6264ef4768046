"""A run's calibration (issue 36, item 3): the same loop and bare stream before and after every run, so that
`show` says how fast the machine was and `compare` says when two runs ran on a machine that measured
differently, beyond what it drifted by within either run."""

from __future__ import annotations

from vnetbench.runner.calibration import differences, lines


def _run(loop: tuple[float, float], veth: tuple[float, float]) -> list[dict]:
    return [{"before": {"cpu_events_per_s": loop[0], "veth_tcp_gbps": veth[0]},
             "after": {"cpu_events_per_s": loop[1], "veth_tcp_gbps": veth[1]}}]


def test_show_gives_each_session_before_then_after():
    two_sessions = _run((1700, 1650), (38.1, 36.0)) + [{"before": {"cpu_events_per_s": 1600, "veth_error": "x"}}]
    assert lines(two_sessions) == [
        "calibration (before then after the run): one core's loop 1700 then 1650 events/s; "
        "a bare veth TCP stream 38.1 then 36 Gbit/s",
        "calibration (before then after the run): one core's loop 1600 then - events/s"]
    assert lines(None) == [] and lines([]) == [] and lines([{"before": {"cpu_error": "no sysbench"}}]) == []


def test_a_machine_that_measured_alike_is_not_named():
    assert differences(_run((1700, 1650), (38, 36)), _run((1680, 1720), (35, 39))) == []
    assert differences(None, _run((1700, 1700), (38, 38))) == []  # a run from before calibrations


def test_a_machine_that_slowed_between_runs_is_named_with_how_much():
    found = differences(_run((1700, 1690), (38, 37)), _run((850, 860), (20, 21)))
    assert len(found) == 2
    assert found[0].startswith("one core's loop measured 1695 then 855 events/s (-50%")
    assert found[1].startswith("a bare veth TCP stream measured 37.5 then 20.5 Gbit/s (-45%")


def test_a_change_within_what_a_run_drifted_by_is_not_named():
    # B's own before and after differ by 40 %: a 35 % move between the runs is no evidence of another machine
    assert differences(_run((1700, 1700), (38, 38)), _run((1300, 900), (38, 38))) == []
