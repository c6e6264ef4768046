"""Scenario validation, --set overrides and matrix expansion."""

import textwrap

import pytest

from vnetbench.errors import ScenarioError
from vnetbench.scenario import load as L
from vnetbench.scenario import plan as P


def write(tmp_path, text):
    f = tmp_path / "s.toml"
    f.write_text(textwrap.dedent(text))
    return str(f)


MINIMAL = """
name = "t"
[lab]
bottleneck = "100Mbit"
buffer = "500kB"
[matrix]
ratio = [0.5, 2.0]
proto = ["udp", "tcp"]
[workload.stream]
tool = "iperf3"
duration = "3s"
offered = "ratio * bottleneck / senders"
[workload.probe]
tool = "ping"
during = "stream"
"""


def error_of(path, overrides=()):
    with pytest.raises(ScenarioError) as e:
        P.expand(L.load(path, list(overrides)))
    return str(e.value)


def test_builtins_load_and_expand():
    assert {"congestion", "quick"} <= set(L.builtin_names())
    configs = P.expand(L.load("congestion"))
    assert len(configs) == 13 * 2
    assert len({c.key for c in configs}) == 26


def test_congestion_offered_load_follows_the_thesis():
    configs = {(c.labels["ratio"], c.labels["proto"]): c for c in P.expand(L.load("congestion"))}
    # Algorithms 1 and 2: B = ratio * 100 Mbit / n, n = 2 up to ratio 2, 3 up to 3, 4 above.
    for ratio, senders in [(0.4, 2), (2.0, 2), (3.0, 3), (4.0, 4)]:
        c = configs[(ratio, "udp")]
        assert c.active_senders == senders
        assert c.offered_bps == pytest.approx(ratio * 100e6 / senders)
        assert c.expected["udp.loss_ratio"] == pytest.approx(max(0.0, 1 - 1 / ratio))
    assert configs[(2.0, "tcp")].expected["queue.full_delay_ms"] == pytest.approx(40.0)
    assert "udp.loss_ratio" not in configs[(2.0, "tcp")].expected
    # The probe's median RTT: an empty queue below saturation, the full 500 kB buffer at 100 Mbit/s above;
    # no closed form for TCP's standing queue.
    assert configs[(0.6, "udp")].expected["rtt.p50_ms"] == 0.0
    assert configs[(1.0, "udp")].expected["rtt.p50_ms"] == 0.0
    assert configs[(1.1, "udp")].expected["rtt.p50_ms"] == pytest.approx(40.0)
    assert "rtt.p50_ms" not in configs[(2.0, "tcp")].expected
    # The links' fixed delay is the base it sits on (both directions, here 2 x 15 ms), and a buffer sweep
    # moves it with buffer / rate.
    swept = P.expand(L.load("congestion", overrides=["lab.delay=15ms", "lab.shape=both", "protos=[udp]",
                                                     "ratios=[2]", "matrix.buffer=[\"125kB\", \"250kB\"]"]))
    assert sorted(c.expected["rtt.p50_ms"] for c in swept) == [pytest.approx(40.0), pytest.approx(50.0)]


def test_unknown_key_lists_valid_ones(tmp_path):
    path = write(tmp_path, MINIMAL.replace('buffer = "500kB"', 'buffer = "500kB"\nbuffr = 3'))
    msg = error_of(path)
    assert path in msg and "lab.buffr: unknown key" in msg and "bottleneck" in msg


def test_wrong_unit_names_file_key_value_and_expectation(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL.replace('"100Mbit"', '"100Mbt"')))
    assert "lab.bottleneck = '100Mbt'" in msg and "unknown rate unit" in msg and "Mbit" in msg


@pytest.mark.parametrize("override,needle", [
    ("bottleneck=-5Mbit", "lab.bottleneck"),
    ("buffer=100B", "smaller than one full-size frame"),
    ("buffer=0.1ms", "1250 B"),
    ("ratios=[0]", "ratio must be above 0"),
    ("duration=0.5s", "whole seconds"),
    ("workload.stream.omit=5s", "omit (5s) must be shorter than duration (3s)"),
    ("workload.probe.interval=10us", "100us"),
    ("senders=0", "senders must be between 1 and 64"),
    ("lab.qdisc=netem", "lab.qdisc = 'netem'"),
])
def test_impossible_values_are_rejected_before_anything_is_built(tmp_path, override, needle):
    assert needle in error_of(write(tmp_path, MINIMAL), [override])


def test_set_resolves_bare_names_and_plurals(tmp_path):
    loaded = L.load(write(tmp_path, MINIMAL), [
        "bottleneck=50Mbit", "ratios=[1.0, 4]", "protos=[udp]", "repetitions=2", "congestion_control=reno",
        "duration=5s", "senders=3",
    ])
    s = loaded.scenario
    assert s.lab.bottleneck == 50e6 and s.lab.senders == 3
    assert s.matrix == {"ratio": [1.0, 4], "proto": ["udp"]}
    assert s.repeat.repetitions == 2
    assert s.workload["stream"].congestion_control == "reno" and s.workload["stream"].duration == 5
    configs = P.expand(loaded)
    assert [c.offered_bps for c in configs] == pytest.approx([50e6 / 3, 200e6 / 3])


def test_set_dotted_path_and_errors(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert L.load(path, ["lab.buffer=40ms"]).scenario.lab.buffer.in_bytes(100e6) == pytest.approx(500_000)
    with pytest.raises(ScenarioError, match="--set nope: .* has no parameter named nope; use a dotted key path"):
        L.load(path, ["nope=1"])
    with pytest.raises(ScenarioError, match=r"each workload has its own tool; say which, e.g. --set workload\.NAME\.tool"):
        L.load(path, ["tool=ping"])
    with pytest.raises(ScenarioError, match="KEY=VALUE"):
        L.load(path, ["bottleneck"])


def test_matrix_axis_must_be_a_parameter(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL.replace("[matrix]", "[matrix]\ncolour = ['red']")))
    assert "matrix.colour is not a parameter" in msg and "bottleneck" in msg


def test_per_configuration_validation_names_the_configuration(tmp_path):
    # 1514 B is fine at 100 Mbit as bytes, but "0.15ms" is 1875 B at 100 Mbit and 187 B at 10 Mbit.
    path = write(tmp_path, MINIMAL.replace("proto = [", "bottleneck = ['100Mbit', '10Mbit']\nproto = [").replace(
        'buffer = "500kB"', 'buffer = "0.15ms"'))
    msg = error_of(path)
    assert "configuration ratio=0.5, bottleneck=10Mbit" in msg and "smaller than one full-size frame" in msg


def test_offered_expression_errors(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL.replace("ratio * bottleneck / senders", "ratio * banana")))
    assert "unknown name 'banana'" in msg
    msg = error_of(write(tmp_path, MINIMAL.replace("ratio * bottleneck / senders", "__import__('os')")))
    assert "only numbers, names" in msg
    assert P.evaluate_offered("unlimited", {}) is None
    assert P.evaluate_offered("25Mbit", {}) == 25e6
    assert P.evaluate_offered("(ratio + 1) * bottleneck / senders", {"ratio": 1, "bottleneck": 10, "senders": 2}) == 10


def test_config_key_is_stable_and_independent_of_fixed_parameters(tmp_path):
    a = {c.label_text: c.key for c in P.expand(L.load(write(tmp_path, MINIMAL)))}
    b = {c.label_text: c.key for c in P.expand(L.load(write(tmp_path, MINIMAL), ["bottleneck=80Mbit"]))}
    assert a == b  # results match across runs by configuration, not by what changed
    assert P.config_key({"ratio": 0.5, "proto": "udp"}) == P.config_key({"proto": "udp", "ratio": 0.5})


def test_interleaved_order_is_seeded_and_balanced(tmp_path):
    configs = P.expand(L.load(write(tmp_path, MINIMAL)))
    a = P.order_trials(configs, 5, "interleaved", seed=7, warmup=True)
    b = P.order_trials(configs, 5, "interleaved", seed=7, warmup=True)
    c = P.order_trials(configs, 5, "interleaved", seed=8, warmup=True)
    keys = lambda slots: [(s.config.key, s.repetition) for s in slots]
    assert keys(a) == keys(b) and keys(a) != keys(c)
    assert a[0].warmup and not any(s.warmup for s in a[1:])
    measured = a[1:]
    assert len(measured) == 20
    # Every round holds each configuration exactly once: drift cannot pile onto one of them.
    for r in range(5):
        round_keys = [s.config.key for s in measured[r * 4:(r + 1) * 4]]
        assert sorted(round_keys) == sorted(c.key for c in configs)
    seq = P.order_trials(configs, 2, "sequential", seed=7, warmup=False)
    assert [s.config.key for s in seq] == [c.key for c in configs for _ in range(2)]


# ------------------------------------------------ environments in the matrix

ENVS = MINIMAL.replace('[lab]\n', '[lab]\nsenders = 1\n').replace(
    'ratio = [0.5, 2.0]\nproto = ["udp", "tcp"]',
    'env = [{env = "bare"}, {env = "vm", nic = "e1000"}, {env = "overlay", overlay = "routed"}, "container"]\n'
    'proto = ["udp", "tcp"]').replace('offered = "ratio * bottleneck / senders"', 'offered = "50Mbit"')


def test_inline_tables_set_parameters_together_and_all_become_labels(tmp_path):
    configs = P.expand(L.load(write(tmp_path, ENVS)))
    assert len(configs) == 4 * 2  # four environments x two protocols: no nic x overlay cross product
    labels = [c.labels for c in configs]
    assert labels[:2] == [{"env": "bare", "proto": "udp"}, {"env": "bare", "proto": "tcp"}]
    assert {"env": "vm", "nic": "e1000", "proto": "udp"} in labels
    assert {"env": "overlay", "overlay": "routed", "proto": "tcp"} in labels
    assert {"env": "container", "proto": "tcp"} in labels  # a plain value sets the axis' own parameter
    by = {c.label_text: c for c in configs}
    vm = by["env=vm, nic=e1000, proto=udp"].scenario.lab
    assert (vm.env, vm.nic, vm.overlay) == ("vm", "e1000", None)
    assert by["env=overlay, overlay=routed, proto=udp"].params()["overlay"] == "routed"
    # The key is still the hash of the labels, so it matches across runs and ignores fixed parameters.
    assert by["env=vm, nic=e1000, proto=udp"].key == P.config_key({"env": "vm", "nic": "e1000", "proto": "udp"})
    assert len({c.key for c in configs}) == 8
    # {env="bare"} and "bare" are the same configuration.
    assert P.config_key({"env": "bare", "proto": "udp"}) == configs[0].key


def test_inline_tables_on_an_axis_that_is_not_a_parameter(tmp_path):
    text = MINIMAL.replace('ratio = [0.5, 2.0]\nproto = ["udp", "tcp"]',
                           'ratio = [0.5]\nload = [{proto = "tcp", parallel = 4}, {proto = "udp", offered = "10Mbit"}]')
    configs = P.expand(L.load(write(tmp_path, text)))
    assert [c.labels for c in configs] == [{"ratio": 0.5, "proto": "tcp", "parallel": 4},
                                          {"ratio": 0.5, "proto": "udp", "offered": "10Mbit"}]
    assert configs[0].stream.parallel == 4 and configs[0].offered_bps == pytest.approx(0.5 * 100e6 / 2)
    assert configs[1].offered_bps == 10e6 and configs[1].stream.parallel == 1


@pytest.mark.parametrize("matrix,needle", [
    ('load = [{proto = "tcp"}, "udp"]', "load is not a parameter, so each value of this axis must be an inline table"),
    ('load = [{colour = "red"}]', "matrix.load: key 'colour' in a table is not a parameter that can be swept; sweepable:"),
    ('load = [{}]', "matrix.load has a table without parameters"),
    ('load = [{if_available = true}]', "matrix.load has a table without parameters"),
    ('load = [{proto = "tcp", if_available = "yes"}]', "matrix.load: if_available = 'yes' must be true or false"),
    ('load = [{proto = "tcp"}]\nproto = ["udp"]', "both set proto"),
])
def test_inline_table_mistakes_are_named(tmp_path, matrix, needle):
    text = MINIMAL.replace('ratio = [0.5, 2.0]\nproto = ["udp", "tcp"]', matrix)
    assert needle in error_of(write(tmp_path, text))


@pytest.mark.parametrize("matrix,needle", [
    ("pin_cpus = [true, false]", "matrix.pin_cpus is not a parameter that can differ between configurations: "
                                 "pin_cpus holds for the whole run"),
    ('"lab.idle_cores" = ["pm-qos", "poll"]', "matrix.lab.idle_cores is not a parameter that can differ between"),
    ('load = [{proto = "tcp", idle_cores = "poll"}]', "set lab.idle_cores once, and run the scenario once per value"),
])
def test_what_holds_for_the_whole_run_is_not_a_matrix_axis(tmp_path, matrix, needle):
    """The lab is built and held once per run: a configuration that said pin_cpus = false ran pinned like the
    first, under its own label."""
    text = MINIMAL.replace('ratio = [0.5, 2.0]\nproto = ["udp", "tcp"]', matrix)
    assert needle in error_of(write(tmp_path, text))


def test_set_takes_inline_tables(tmp_path):
    loaded = L.load(write(tmp_path, ENVS), ['env=[{env="bare"},{env="container",cpu_quota="50%"}]'])
    assert loaded.scenario.matrix["env"] == [{"env": "bare"}, {"env": "container", "cpu_quota": "50%"}]
    container = [c for c in P.expand(loaded) if c.labels["env"] == "container"][0]
    assert container.scenario.lab.cpu_quota == 0.5 and container.labels["cpu_quota"] == "50%"


@pytest.mark.parametrize("override,needle", [
    ("lab.nic=e1000", "nic = 'e1000' applies to env = 'vm' only, but env = 'bare'"),
    ("lab.overlay=routed", "overlay = 'routed' applies to env = 'overlay' only"),
    ("cpu_quota=50%", "cpu_quota = 0.5 applies to env = 'container' / 'docker' / 'podman' only"),
    ("lab.env=lxc", "lab.env = 'lxc'"),
    ("lab.nic=ne2000", "lab.nic = 'ne2000'"),
    ("lab.overlay=geneve", "lab.overlay = 'geneve'"),
    ("lab.offload=maybe", "lab.offload = 'maybe'"),
    ("lab.cpuset=two", "'two' is not a CPU list"),
    ("lab.cpu_quota=lots", "'lots' is not a CPU quota"),
    ("lab.cpu_quota=0%", "between 1% (0.01) and 1024 CPUs"),
    ("lab.vcpus=0", "lab.vcpus"),
])
def test_environment_options_are_validated(tmp_path, override, needle):
    assert needle in error_of(write(tmp_path, MINIMAL), [override])


@pytest.mark.parametrize("override,needle", [
    ('env=[{env="podman",userland_proxy=false}]', "userland_proxy = False applies to env = 'docker' only"),
    ('env=[{env="container",network="host"}]', "network = 'host' applies to env = 'docker' / 'podman' only"),
    ('env=[{env="docker",network="macvlan"}]', "'bridge', 'host' or 'overlay'"),
])
def test_engine_network_options_are_validated(tmp_path, override, needle):
    assert needle in error_of(write(tmp_path, ENVS), [override])


def test_an_option_in_the_wrong_environment_names_the_configuration(tmp_path):
    text = ENVS.replace('{env = "bare"}', '{env = "container", nic = "virtio-net"}')
    msg = error_of(write(tmp_path, text))
    assert "configuration env=container, nic=virtio-net, proto=udp" in msg
    assert "nic = 'virtio-net' applies to env = 'vm' only, but env = 'container'" in msg
    assert '{env = "vm", nic = \'virtio-net\'}' in msg  # how to write it instead


def test_container_limits_parse(tmp_path):
    lab = L.load(write(tmp_path, MINIMAL), ["lab.env=container", "cpu_quota=150%", "cpuset=0-1",
                                            "memory_limit=256MiB"]).scenario.lab
    assert (lab.cpu_quota, lab.cpuset, lab.memory_limit) == (1.5, "0-1", 256 * 2**20)
    assert L.load(write(tmp_path, MINIMAL), ["lab.env=container", "cpu_quota=0.25"]).scenario.lab.cpu_quota == 0.25


def test_unlimited_bottleneck_has_no_queue_theory(tmp_path):
    configs = P.expand(L.load(write(tmp_path, ENVS), ["bottleneck=unlimited"]))
    c = configs[0]
    assert c.scenario.lab.bottleneck is None and c.params()["bottleneck_bps"] is None
    assert c.expected == {"throughput.offered_mbps": 50.0}
    # An expression that needs the bottleneck says so.
    msg = error_of(write(tmp_path, MINIMAL), ["bottleneck=unlimited"])
    assert "unknown name 'bottleneck'" in msg


def test_environment_builtins_compare_every_environment_with_bare():
    vc = P.expand(L.load("virt-compare"))
    envs = {(c.labels["env"], c.labels.get("nic"), c.labels.get("overlay")) for c in vc}
    assert envs == {("bare", None, None), ("container", None, None), ("docker", None, None), ("podman", None, None),
                    ("vm", "virtio-net", None), ("vm", "e1000", None), ("overlay", None, "vxlan"),
                    ("overlay", None, "routed")}
    assert len(vc) == 8 * 2 * 8 and all(c.scenario.lab.bottleneck is None for c in vc)
    # the engines run where they answer; the rest of the study is never left out
    assert {c.labels["env"] for c in vc if c.if_available} == {"docker", "podman"}
    loads = {(c.labels["proto"], c.labels.get("parallel"), c.labels.get("offered")) for c in vc}
    assert loads == {("tcp", 1, None), ("tcp", 4, None), ("tcp", 16, None), ("udp", None, "10Mbit"),
                     ("udp", None, "20Mbit"), ("udp", None, "50Mbit"), ("udp", None, "100Mbit"),
                     ("udp", None, "unlimited")}
    udp_unlimited = next(c for c in vc if c.labels.get("offered") == "unlimited")
    assert udp_unlimited.offered_bps is None and udp_unlimited.stream.proto == "udp"
    ol = P.expand(L.load("overlay-latency"))
    assert {(c.labels["env"], c.labels.get("overlay")) for c in ol} == {
        ("bare", None), ("overlay", "vxlan"), ("overlay", "routed")}
    # Seed 004's injected one-way delays, on the underlay link in both directions.
    assert sorted({c.scenario.lab.delay for c in ol}) == [0.0, 0.015, 0.03] and len(ol) == 3 * 3 * 3
    assert all(c.scenario.lab.shape == "both" for c in ol)
    assert all(c.scenario.lab.senders == 1 for c in vc + ol)


# ------------------------------------------- key paths and named cases (issue 31, item 4)

def _links(config):
    from vnetbench.impair.model import lab_links
    return {name: spec.describe() for name, spec in lab_links(config.scenario.lab).items()}


def test_a_link_key_path_sweeps_one_key_of_one_direction(tmp_path):
    text = MINIMAL.replace("[matrix]", '[lab.link.s1]\nreverse = {delay = "1ms"}\n[matrix]\n'
                                        '"link.bottleneck.forward.delay" = ["5ms", "50ms"]\n'
                                        '"lab.link.s1.both.loss" = ["1%"]')
    configs = P.expand(L.load(write(tmp_path, text), []))
    assert len(configs) == 2 * 2 * 2
    far = [c for c in configs if c.labels["link.bottleneck.forward.delay"] == "50ms"][0]
    # The rest of the link stays: the bottleneck's rate and buffer, s1's own reverse delay; both = each direction.
    assert _links(far) == {"bottleneck": "forward: rate 100Mbit, buffer 500kB, delay 50ms",
                           "s1": "forward: loss bernoulli 1%; reverse: delay 1ms, loss bernoulli 1%"}


@pytest.mark.parametrize("axis, needle", [
    ('"link.bottleneck.sideways.delay" = ["5ms"]', "a link's key path is link.NAME.KEY, KEY one of backend, both"),
    ('"link.r9.forward.delay" = ["5ms"]', "no link named 'r9'"),
    ('"link.bottleneck.forward.delay" = ["soon"]', "soon"),
    ('"lab.colour" = ["red"]', "matrix.lab.colour is not a parameter that can be swept"),
])
def test_link_key_path_mistakes_are_named(tmp_path, axis, needle):
    assert needle in error_of(write(tmp_path, MINIMAL.replace("[matrix]", "[matrix]\n" + axis)))


CASES = """
name = "t"
[lab]
bottleneck = "100Mbit"
[[case]]
name = "near"
delay = "5ms"
[[case]]
name = "far-and-lossy"
delay = "50ms"
"link.s1.forward.loss" = "1%"
[matrix]
proto = ["udp", "tcp"]
[workload.stream]
tool = "iperf3"
duration = "3s"
"""


def test_named_cases_are_configurations_labelled_by_their_name(tmp_path):
    configs = P.expand(L.load(write(tmp_path, CASES), []))
    assert [c.labels for c in configs] == [{"proto": p, "case": c} for p in ("udp", "tcp")
                                           for c in ("near", "far-and-lossy")]
    lossy = configs[1]
    assert _links(lossy) == {"bottleneck": "forward: rate 100Mbit, buffer 500kB, delay 50ms",
                             "s1": "forward: loss bernoulli 1%"}
    assert lossy.key != configs[0].key and P.matrix_size(L.load(write(tmp_path, CASES), []).scenario) == 4


@pytest.mark.parametrize("change, needle", [
    (lambda t: t.replace('name = "near"\n', ""), "case 1 has no name"),
    (lambda t: t.replace('name = "near"', 'name = "far-and-lossy"'), "case 'far-and-lossy' is named twice"),
    (lambda t: t.replace('name = "near"', 'name = "../x"'), "case '../x' is not a name"),
    (lambda t: t.replace('name = "near"\ndelay = "5ms"', 'name = "near"'), "case 'near' sets nothing"),
    (lambda t: t.replace('delay = "5ms"', 'colour = "red"'), "[[case]] key 'colour' is not a parameter"),
    (lambda t: t.replace('proto = ["udp", "tcp"]', 'delay = ["1ms"]'), "both set delay"),
    (lambda t: t.replace('proto = ["udp", "tcp"]', 'case = [{delay = "1ms"}]'), "both label configurations 'case'"),
])
def test_case_mistakes_are_named(tmp_path, change, needle):
    assert needle in error_of(write(tmp_path, change(CASES)))


def test_set_takes_a_link_key_path_as_the_matrix_does(tmp_path):
    path = write(tmp_path, MINIMAL)
    configs = P.expand(L.load(path, ["link.s1.forward.delay=3ms"]))
    assert _links(configs[0])["s1"] == "forward: delay 3ms"
    assert "no link named 'r9'" in error_of(path, ["link.r9.forward.delay=3ms"])


def test_a_matrix_axis_named_case_is_still_an_axis(tmp_path):
    # The cases' own axis must not take the place of a matrix axis of that name (it made no configuration).
    text = MINIMAL.replace("[matrix]", '[matrix]\ncase = [{delay = "1ms"}, {delay = "2ms", loss = "1%"}]')
    configs = P.expand(L.load(write(tmp_path, text), []))
    assert len(configs) == 2 * 2 * 2
    assert {c.labels["delay"] for c in configs} == {"1ms", "2ms"}
