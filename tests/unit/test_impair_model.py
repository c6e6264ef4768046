"""Link conditions as data: parsing, validation, capabilities, schedules, traces,
and how a scenario's lab declares and sweeps them."""

import textwrap

import pytest
from pydantic import ValidationError

from vnetbench.errors import ScenarioError
from vnetbench.impair.model import (LinkConditions, LinkSpec, LossSpec, QueueSpec, Schedule, bottleneck_from_lab,
                                    lab_links, mahimahi_mean_rate, read_mahimahi)
from vnetbench.scenario import load as L
from vnetbench.scenario import plan as P


def test_units_and_probabilities_are_parsed():
    c = LinkConditions.model_validate({"rate": "100Mbit", "buffer": "20ms", "delay": "15ms", "jitter": "300us",
                                       "loss": "1%", "duplicate": 0.002, "corrupt": "0.1%", "reorder": "25%"})
    assert c.rate == 100e6 and c.delay == pytest.approx(0.015) and c.jitter == pytest.approx(300e-6)
    assert c.buffer_bytes() == pytest.approx(250_000)  # 20 ms at 100 Mbit/s
    assert c.loss.model == "bernoulli" and c.loss.p == pytest.approx(0.01)
    assert (c.duplicate, c.corrupt, c.reorder) == pytest.approx((0.002, 0.001, 0.25))
    assert LinkConditions.model_validate({"rate": "unlimited"}).rate is None


@pytest.mark.parametrize("raw,needle", [
    ({"loss": "120%"}, "probability between 0 and 1"),
    ({"loss": "lots"}, "not a probability"),
    ({"delay": "-1ms"}, "not a duration"),
    ({"delay": "10 parsecs"}, "unknown duration unit"),
    ({"rate": "unlimited", "buffer": "20ms"}, "give the buffer in bytes"),
    ({"queue": {"kind": "red", "min": "30kB"}}, "needs min and max"),
    ({"queue": {"kind": "codel", "min": "30kB"}}, "takes no min"),
    ({"queue": "sfq"}, "queue.kind"),
    ({"queue": {"kind": "fq", "quantum": "10B"}}, "give 64 B to 64 KiB"),
    ({"queue": {"kind": "fq", "target": "1ms"}}, "takes no target (its parameters: quantum)"),
    ({"loss": {"model": "gilbert_elliott", "p": "1%"}}, "needs r"),
    ({"loss": {"model": "bernoulli", "p": "1%", "r": "10%"}}, "belong to model"),
    ({"rate": "1Mbit", "speed": 3}, "speed"),
])
def test_bad_conditions_say_what_to_write(raw, needle):
    with pytest.raises(ValidationError) as e:
        LinkConditions.model_validate(raw)
    assert needle in str(e.value)


def test_loss_models():
    ge = LossSpec.model_validate({"model": "gemodel", "p": "1%", "r": "30%"})
    assert ge.model == "gilbert_elliott" and ge.loss_bad == 1.0 and ge.loss_good == 0.0
    assert ge.mean_loss() == pytest.approx(0.01 / 0.31)  # stationary share of Bad, all lost there
    assert LossSpec.model_validate("0%").model == "none" and not LossSpec.model_validate("none").active
    assert QueueSpec.model_validate("drop-head").kind == "drop_head"


def test_needs_names_every_capability_used():
    c = LinkConditions.model_validate({"rate": "1Mbit", "buffer": "10kB", "delay": "1ms", "jitter": "1ms",
                                       "distribution": "pareto", "loss": {"model": "ge", "p": 0.1, "r": 0.5},
                                       "queue": "codel", "reorder": 0.1, "duplicate": 0.1, "corrupt": 0.1})
    assert c.needs() == {"rate", "buffer", "delay", "jitter", "jitter:pareto", "loss:gilbert_elliott",
                         "queue:codel", "reorder", "duplicate", "corrupt"}
    assert LinkConditions().needs() == set() and LinkConditions().is_plain()
    with pytest.raises(ValidationError, match="not one whole number of milliseconds"):  # this file is no trace
        LinkSpec.model_validate({"forward": {"rate": "10Mbit"}, "schedule": "trace:" + __file__})


def test_both_is_merged_under_each_direction_and_dumps_stay_partial():
    spec = LinkSpec.model_validate({"both": {"delay": "5ms", "loss": "1%"}, "forward": {"rate": "50Mbit",
                                                                                         "delay": "7ms"}})
    assert spec.forward.delay == pytest.approx(0.007) and spec.reverse.delay == pytest.approx(0.005)
    assert spec.reverse.loss.p == pytest.approx(0.01) and spec.reverse.rate is None
    dumped = spec.model_dump()
    assert set(dumped["reverse"]) == {"delay", "loss"}  # nothing nobody wrote
    assert LinkSpec.model_validate(dumped) == spec  # survives matrix expansion's dump/re-validate


def test_compact_schedule_repeats_the_cycle():
    s = Schedule.model_validate("100Mbit/5s 20Mbit/5s")
    assert s.every == 10 and s.direction == "forward"
    steps = s.expand(22)
    assert [(x.at, x.for_direction("forward").rate) for x in steps] == [
        (0, 100e6), (5, 20e6), (10, 100e6), (15, 20e6), (20, 100e6)]
    assert s.needs() == {"schedule", "rate"}
    assert s.initial("forward").rate == 100e6 and s.initial("reverse") is None
    assert "repeat: rate 100Mbit for 5s; rate 20Mbit for 5s" == s.describe()


def test_schedule_steps_and_their_errors():
    s = Schedule.model_validate([{"at": "0s", "forward": {"rate": "10Mbit"}},
                                 {"at": "2s", "both": {"delay": "50ms"}, "reverse": {"loss": "1%"}}])
    step = s.steps[1]
    assert step.for_direction("reverse").delay == pytest.approx(0.05)
    assert step.for_direction("reverse").loss.p == pytest.approx(0.01)
    assert step.for_direction("forward").model_fields_set == {"delay"}  # partial: only what the step changes
    for raw, needle in [([{"at": "2s", "forward": {"rate": "1Mbit"}}, {"at": "1s", "forward": {"rate": "2Mbit"}}],
                         "time order"),
                        ({"steps": [{"at": "12s", "forward": {"rate": "1Mbit"}}], "every": "10s"}, "within one period"),
                        ("100Mbit 20Mbit", "RATE/TIME"),
                        ("100Mbit/0s", "lasts 0ns: a step lasts at least 1ms"), ("100Mbit/0.5ms 1Mbit/1s", "a step lasts at least 1ms"),
                        ({"steps": []}, "needs steps or a trace")]:
        with pytest.raises(ValidationError) as e:
            Schedule.model_validate(raw)
        assert needle in str(e.value), raw


def test_mahimahi_trace(tmp_path):
    trace = tmp_path / "t.trace"
    trace.write_text("0\n0\n1\n3\n4\n")  # 5 opportunities of 1500 B per 4 ms
    read = read_mahimahi(trace)
    assert (read.opportunities, read.period_ms) == (5, 4)
    assert mahimahi_mean_rate(read) == pytest.approx(5 * 1500 * 8 / 0.004)
    s = Schedule.model_validate(f"trace:{trace}")
    assert s.trace == str(trace) and s.needs() == {"trace"} and s.trace_directions() == ("forward",)
    for text, needle in [("1\nx\n", "line 2 is not one whole number"), ("3\n2\n", "line 2 goes back in time"),
                         ("", "empty"), ("\n \n", "empty"), ("0\n0\n", "positive"), ("1 2\n", "line 1 is not one"),
                         ("1\n" + "9" * 20 + "\n", "line 2: a timestamp of more than 12 digits"),
                         ("\n\n5\r\n7\n", None)]:
        trace.write_text(text)
        if needle is None:
            assert read_mahimahi(trace).opportunities == 2
            continue
        with pytest.raises(ValueError, match=needle):
            read_mahimahi(trace)
    with pytest.raises(ValidationError, match="cannot be read"):
        Schedule.model_validate(f"trace:{tmp_path / 'missing.trace'}")


def _scenario(tmp_path, lab: str, matrix: str = "", extra: str = "") -> str:
    f = tmp_path / "s.toml"
    f.write_text(textwrap.dedent(f"""
        name = "t"
        [lab]
        {lab}
        [matrix]
        proto = ["tcp"]
        {matrix}
        [workload.stream]
        tool = "iperf3"
        duration = "3s"
        {extra}
    """))
    return str(f)


def test_lab_short_hands_feed_the_bottleneck_link(tmp_path):
    path = _scenario(tmp_path, 'bottleneck = "50Mbit"\nbuffer = "10ms"\ndelay = "15ms"\nloss = "0.5%"\nshape = "both"')
    lab = L.load(path).scenario.lab
    spec = bottleneck_from_lab(lab)
    for d in ("forward", "reverse"):
        c = spec.direction(d)
        assert c.rate == 50e6 and c.buffer_bytes() == pytest.approx(62_500) and c.delay == pytest.approx(0.015)
        assert c.loss.p == pytest.approx(0.005)
    assert spec.needs() == {"rate", "buffer", "delay", "loss"}
    # The existing dumbbell: rate + buffer forward only, which tbf does.
    default = bottleneck_from_lab(L.load(_scenario(tmp_path, 'bottleneck = "100Mbit"')).scenario.lab)
    assert default.forward.needs() == {"rate", "buffer"} and default.reverse.is_plain()
    assert bottleneck_from_lab(L.load(_scenario(tmp_path, 'bottleneck = "unlimited"')).scenario.lab).is_plain()


def test_link_table_per_direction_on_top_of_short_hands(tmp_path):
    lab = textwrap.dedent('''
        bottleneck = "100Mbit"
        [lab.link.bottleneck]
        backend = "userspace"
        forward = {delay = "10ms", queue = "codel"}
        reverse = {delay = "10ms", loss = {model = "gilbert_elliott", p = "1%", r = "30%"}}
        seed = 42
        [lab.link.s1]
        forward = {rate = "1Gbit", buffer = "1MB"}
    ''')
    links = lab_links(L.load(_scenario(tmp_path, lab)).scenario.lab)
    b = links["bottleneck"]
    assert b.backend == "userspace" and b.seed == 42
    assert b.forward.rate == 100e6 and b.forward.queue.kind == "codel" and b.forward.delay == pytest.approx(0.01)
    assert b.reverse.loss.model == "gilbert_elliott" and b.reverse.rate is None
    assert links["s1"].forward.rate == 1e9


def test_matrix_sweeps_link_short_hands(tmp_path):
    path = _scenario(tmp_path, 'bottleneck = "100Mbit"', 'delay = ["0.3ms", "3ms", "30ms"]')
    configs = P.expand(L.load(path))
    assert [c.labels["delay"] for c in configs] == ["0.3ms", "3ms", "30ms"]
    assert [bottleneck_from_lab(c.scenario.lab).forward.delay for c in configs] == pytest.approx([3e-4, 3e-3, 3e-2])
    assert len({c.key for c in configs}) == 3


@pytest.mark.parametrize("lab,needle", [
    ('delay = "10ms"\nbackend = "tbf"',
     "backend 'tbf' cannot emulate delay: use 'netem' (kernel network emulator) where the kernel has it or "
     "'userspace' (vnb-link) or 'auto'"),
    ('[lab.link.bottleneck]\nbackend = "netem"\nforward = {queue = "pie"}',
     "backend 'netem' cannot emulate a PIE queue: use 'userspace' (vnb-link) or 'auto'"),
    ('bottleneck = "50Mbit"\n[lab.link.bottleneck]\nforward = {rate = "20Mbit"}',
     "lab.bottleneck and lab.link.bottleneck.forward.rate both set the bottleneck's forward rate"),
    ('[lab.link.r]\nforward = {delay = "1ms"}', "no link named 'r'"),
    ('bottleneck_schedule = "100Mbit every 5s"', "RATE/TIME"),
    ('[lab.link.bottleneck]\nforward = {delay = "1ms", colour = "red"}', "colour"),
])
def test_impossible_link_requests_fail_at_validation(tmp_path, lab, needle):
    with pytest.raises(ScenarioError) as e:
        L.load(_scenario(tmp_path, lab))
    assert needle in str(e.value) and str(tmp_path) in str(e.value)


def test_set_overrides_reach_link_conditions(tmp_path):
    path = _scenario(tmp_path, 'bottleneck = "100Mbit"')
    lab = L.load(path, ["lab.link.bottleneck.reverse.delay=7ms", "delay=3ms", "loss=1%"]).scenario.lab
    spec = bottleneck_from_lab(lab)
    assert spec.reverse.delay == pytest.approx(0.007) and spec.forward.delay == pytest.approx(0.003)
    assert spec.forward.loss.p == pytest.approx(0.01) and spec.reverse.loss.model == "none"


def test_builtin_scenarios_expand():
    static = P.expand(L.load("static-congestion"))
    assert len(static) == 3 * 3 * 2 * 2 * 2
    by = {(c.labels["delay"], c.labels["ratio"], c.labels["proto"]): c for c in static}
    c = by[("30ms", 2, "udp")]
    assert c.scenario.lab.bottleneck == 500e6 and c.offered_bps == pytest.approx(1e9)  # the line rate
    assert bottleneck_from_lab(c.scenario.lab).needs() == {"rate", "buffer", "delay"}
    assert by[("0.3ms", 8, "tcp")].scenario.lab.bottleneck == 125e6 and c.stream.window == 400e3
    dynamic = P.expand(L.load("dynamic-congestion"))
    assert [c.labels["congestion_control"] for c in dynamic] == ["cubic", "bbr"]
    spec = bottleneck_from_lab(dynamic[0].scenario.lab)
    assert spec.schedule.every == 10 and spec.needs() >= {"schedule", "rate", "delay"}
    stream = dynamic[0].stream
    assert stream.span == 30 and stream.timing(1) == (5.0, 15.0) and dynamic[0].scenario.samplers
    # the documented override: the thesis' 10 Gbit/s rates whatever this machine measured (tests/unit/test_scale.py)
    ten = P.expand(L.load("static-congestion", ["scale.to=10Gbit"]))
    assert {c.scenario.lab.bottleneck for c in ten} == {5e9, 2.5e9, 1.25e9} and ten[0].offered_bps == 10e9
    assert ten[0].stream.window == 4e6


def test_a_fair_queue_is_the_emulators_with_its_quantum():
    from vnetbench.impair.userspace import queue_settings

    c = LinkConditions.model_validate({"rate": "10Mbit", "queue": "FQ"})
    assert c.queue.kind == "fq" and c.needs() == {"rate", "queue:fq"} and "queue fq" in c.describe()
    assert queue_settings(c) == {"kind": "fq", "quantum": 1514}
    c = LinkConditions.model_validate({"rate": "10Mbit", "queue": {"kind": "fq", "quantum": "3kB"}})
    assert queue_settings(c) == {"kind": "fq", "quantum": 3000}
