"""Backend choice (auto and explicit, with the errors that say what would work),
the netem commands built from tc-netem(8), and vnb-link's JSON config.

netem cannot run on the machine these were written on (its kernel has no
sch_netem): the commands are checked here against tc-netem(8) semantics.
"""

import json
import subprocess

import pytest

from vnetbench.errors import EnvironmentProblem, ScenarioError
from vnetbench.impair import backends as B
from vnetbench.impair import netem
from vnetbench.impair.links import staggered
from vnetbench.impair.model import LinkConditions, LinkSpec
from vnetbench.impair.userspace import emulator_config, settings

ALL = B.Capabilities(qdiscs={"tbf": None, "htb": None, "netem": None}, vnb_link="/x/vnb-link")
NO_NETEM = B.Capabilities(qdiscs={"tbf": None, "htb": None, "netem": "Error: Specified qdisc kind is unknown."},
                          vnb_link="/x/vnb-link")
NOTHING = B.Capabilities(qdiscs={"tbf": None, "htb": None, "netem": "Error: Specified qdisc kind is unknown."},
                         vnb_link=None)


def spec(**kw):
    return LinkSpec.model_validate(kw)


@pytest.mark.parametrize("request_,caps,rate_qdisc,expected", [
    (spec(forward={"rate": "100Mbit", "buffer": "500kB"}), NO_NETEM, "tbf", "tbf"),
    (spec(forward={"rate": "100Mbit", "buffer": "500kB"}), ALL, "htb", "htb"),
    (spec(), NO_NETEM, "tbf", "tbf"),  # a plain link: the rate qdisc clears it
    (spec(forward={"rate": "100Mbit", "delay": "10ms"}), ALL, "tbf", "netem"),
    (spec(forward={"rate": "100Mbit", "delay": "10ms"}), NO_NETEM, "tbf", "userspace"),
    (spec(forward={"loss": {"model": "ge", "p": "1%", "r": "10%"}}), ALL, "tbf", "netem"),
    (spec(forward={"rate": "100Mbit", "queue": "codel"}), ALL, "tbf", "userspace"),  # netem has no CoDel here
    (spec(forward={"rate": "100Mbit"}, schedule="100Mbit/1s 10Mbit/1s"), ALL, "tbf", "userspace"),
])
def test_auto(request_, caps, rate_qdisc, expected):
    assert B.choose(request_, "auto", caps=caps, rate_qdisc=rate_qdisc) == expected


def test_explicit_backend_that_cannot_express_the_request_says_why_and_what_would_work():
    with pytest.raises(ScenarioError) as e:
        B.choose(spec(forward={"delay": "10ms"}), "tbf", caps=NO_NETEM)
    assert str(e.value) == "backend 'tbf' cannot emulate delay: use 'userspace' (vnb-link) or 'auto'"
    with pytest.raises(ScenarioError) as e:
        B.choose(spec(forward={"delay": "10ms", "loss": "1%"}), "htb", caps=ALL)
    assert str(e.value) == ("backend 'htb' cannot emulate delay and random loss: use 'netem' (kernel network "
                            "emulator) or 'userspace' (vnb-link) or 'auto'")
    with pytest.raises(ScenarioError, match="'netem' cannot emulate a CoDel queue and a schedule"):
        B.choose(spec(forward={"queue": "codel"}, schedule="1Mbit/1s 2Mbit/1s"), "netem", caps=ALL)


def test_explicit_backend_missing_on_this_machine():
    with pytest.raises(EnvironmentProblem) as e:
        B.choose(spec(forward={"delay": "10ms"}), "netem", caps=NO_NETEM)
    msg = str(e.value)
    assert "backend 'netem' is not available here" in msg and "Specified qdisc kind is unknown" in msg
    assert msg.endswith("use 'userspace' (vnb-link) or 'auto'")
    with pytest.raises(EnvironmentProblem, match="make setup"):
        B.choose(spec(forward={"delay": "10ms"}), "userspace", caps=NOTHING)
    with pytest.raises(EnvironmentProblem, match="make setup"):
        B.choose(spec(forward={"delay": "10ms"}), "auto", caps=NOTHING)


def test_auto_is_chosen_once_over_the_whole_run():
    # A sweep over delay 0 and 30 ms must not measure one point with tbf and the other with the emulator.
    assert B.auto_choice({"rate", "buffer"}, NO_NETEM, "tbf", "lab.link.bottleneck") == "tbf"
    assert B.auto_choice({"rate", "buffer", "delay"}, NO_NETEM, "tbf", "lab.link.bottleneck") == "userspace"
    assert B.auto_choice({"rate", "buffer", "delay"}, ALL, "tbf", "lab.link.bottleneck") == "netem"
    assert B.auto_choice(set(), NO_NETEM, "htb", "lab.link.bottleneck") == "htb"
    with pytest.raises(EnvironmentProblem, match=r"^lab.link.bottleneck needs the userspace emulator \(netem "
                                                 r"cannot emulate .*queue.*\), and the userspace emulator"):
        B.auto_choice({"rate", "queue:codel"}, B.Capabilities(ALL.qdiscs, None), "tbf", "lab.link.bottleneck")


def test_every_backend_registers_itself_with_what_it_can_do():
    assert list(B.REGISTRY) == ["tbf", "htb", "netem", "userspace"]  # cheapest first
    assert B.backend_class("tbf") is B.backend_class("htb") and B.REGISTRY["netem"].probe_qdisc
    assert B.REGISTRY["tbf"].can == B.RATE_QDISC_NEEDS < B.REGISTRY["netem"].can < B.REGISTRY["userspace"].can
    with pytest.raises(ValueError, match="unknown backend 'cake'; known: tbf, htb, netem, userspace"):
        B.backend_class("cake")


def test_egress_of_each_direction():
    sw, host = object(), object()
    rx = B.LabLink("bottleneck", sw, host, host_upstream=False)
    assert rx.egress("forward") is sw and rx.egress("reverse") is host
    tx = B.LabLink("s1", sw, host, host_upstream=True)
    assert tx.egress("forward") is host and tx.egress("reverse") is sw


# ------------------------------------------------------------------- netem


def cond(**kw):
    return LinkConditions.model_validate(kw)


def test_netem_delay_jitter_loss_and_a_tbf_child():
    cmds = netem.commands("vnb-x-sw", "r", cond(rate="100Mbit", buffer="500kB", delay="15ms", jitter="2ms",
                                                 loss="1%", duplicate="0.5%", corrupt="0.1%", reorder="25%"))
    # limit: the delay line (100 Mbit/s x (15 + 4 x 2) ms of 100-byte frames) plus the queue (500 kB)
    assert int(100e6 / 8 * 0.023 / 100 + 500_000 / 100) == 7875
    assert cmds == [
        ["tc", "-n", "vnb-x-sw", "qdisc", "add", "dev", "r", "root", "handle", "1:", "netem", "limit", "7875",
         "delay", "15000us", "2000us", "distribution", "normal", "loss", "random", "1%", "duplicate", "0.5%",
         "corrupt", "0.1%", "reorder", "25%", "rate", "100gbit"],
        ["tc", "-n", "vnb-x-sw", "qdisc", "add", "dev", "r", "parent", "1:1", "handle", "10:", "tbf", "rate",
         "100000000bit", "burst", "12500", "limit", "500000"],
    ]
    assert netem.clear_command("vnb-x-sw", "r") == ["tc", "-n", "vnb-x-sw", "qdisc", "del", "dev", "r", "root"]


def test_netem_semantics():
    # uniform is netem's table-less default: no `distribution`; reordering jitter: no ordering rate
    args = netem.netem_args(cond(delay="10ms", jitter="1ms", distribution="uniform", jitter_reorders=True))
    assert "distribution" not in args and "rate" not in args
    ge = netem.netem_args(cond(loss={"model": "gilbert_elliott", "p": "1%", "r": "30%", "loss_bad": "90%"}))
    assert ge[ge.index("loss"):] == ["loss", "gemodel", "1%", "30%", "90%", "0%"]
    assert netem.netem_args(cond(delay="300us"))[3:5] == ["delay", "300us"]
    assert netem.commands("n", "d", cond()) == []  # a plain direction: nothing installed
    htb = netem.commands("n", "d", cond(rate="1Gbit", buffer="1MB", delay="1ms"), rate_qdisc="htb")
    assert [c[3:7] for c in htb] == [["qdisc", "add", "dev", "d"]] * 2 + [["class", "add", "dev", "d"]] + [
        ["qdisc", "add", "dev", "d"]]
    assert htb[2][-8:] == ["rate", "1000000000bit", "ceil", "1000000000bit", "burst", "125000", "cburst", "125000"]
    assert htb[3][-7:] == ["parent", "10:1", "handle", "11:", "bfifo", "limit", "1000000"]
    # the delay line holds in-flight packets as well as the queue: 10 Gbit/s x 30 ms of 100-byte frames
    assert netem.delay_line_limit(cond(delay="30ms"), 1500) == int(10e9 / 8 * 0.030 / 100 + 1000 * 1514 / 100)
    assert netem.tc_supports_seed("tc utility, iproute2-6.5.0") and not netem.tc_supports_seed("iproute2-6.1.0")
    assert netem.netem_args(cond(loss="1%"), seed=7)[-2:] == ["seed", "7"]


def test_netem_readback_parser():
    text = json.dumps([{"kind": "noqueue", "handle": "0:"}, {"kind": "netem", "handle": "1:", "drops": 3,
                                                                "options": {"limit": 1000}}])
    assert netem.parse_show(text) == [{"kind": "netem", "handle": "1:", "drops": 3, "options": {"limit": 1000}}]
    assert netem.parse_show("garbage")[0]["unparsed"] == "garbage"


# -------------------------------------------------------------- vnb-link JSON


def test_emulator_settings_full_and_partial():
    c = cond(rate="50Mbit", buffer="20ms", delay="10ms", jitter="1ms", distribution="pareto",
             loss={"model": "ge", "p": "1%", "r": "30%"}, queue={"kind": "codel", "target": "2ms"})
    full = settings(c)
    assert full["rate_bps"] == 50_000_000 and full["buffer_bytes"] == 125_000 and full["buffer_packets"] is None
    assert full["delay_ms"] == pytest.approx(10) and full["jitter_ms"] == pytest.approx(1)
    assert full["jitter_dist"] == "pareto" and full["trace_file"] is None
    assert full["loss"] == {"model": "gilbert_elliott", "p": 0.01, "r": 0.3, "one_minus_h": 1.0, "one_minus_k": 0.0}
    assert full["qdisc"] == {"kind": "codel", "target_ms": pytest.approx(2.0), "interval_ms": pytest.approx(100.0)}
    # a plain direction resets everything (a control update replaces the whole direction)
    assert settings(cond())["rate_bps"] == 0 and settings(cond())["loss"] == {"model": "none"}
    # partial: only what a schedule step gives; a buffer in time at the rate then in force
    assert settings(cond(rate="20Mbit"), partial=True) == {"rate_bps": 20_000_000}
    assert settings(cond(buffer="10ms"), partial=True, rate_for_buffer=8e6) == {"buffer_bytes": 10_000,
                                                                                  "buffer_packets": None}


def test_emulator_config_unrolls_the_schedule_from_the_trial_start(tmp_path):
    s = spec(forward={"rate": "100Mbit", "buffer": "250kB", "delay": "5ms"}, schedule="100Mbit/5s 20Mbit/5s",
             seed=3)
    cfg = emulator_config(s, until=22)
    assert cfg["seed"] == 3 and cfg["a_to_b"]["rate_bps"] == 100_000_000 and cfg["b_to_a"]["delay_ms"] == 0
    assert [(x["at_ms"], x["a_to_b"]["rate_bps"]) for x in cfg["schedule"]] == [
        (5000, 20_000_000), (10000, 100_000_000), (15000, 20_000_000), (20000, 100_000_000)]
    assert "schedule" not in emulator_config(s)  # between trials: the initial settings only
    trace = tmp_path / "x.trace"
    trace.write_text("1\n2\n")
    t = emulator_config(spec(schedule={"trace": str(trace), "direction": "both"}))
    assert t["a_to_b"]["trace_file"] == t["b_to_a"]["trace_file"] == str(trace.resolve())


@pytest.mark.skipif(B.find_binary() is None, reason="vnb-link not built (make setup)")
def test_vnb_link_accepts_what_we_generate(tmp_path):
    trace = tmp_path / "x.trace"
    trace.write_text("1\n2\n5\n")
    s = spec(both={"delay": "5ms", "jitter": "1ms", "distribution": "paretonormal", "jitter_reorders": True},
             forward={"rate": "100Mbit", "buffer": "10ms", "queue": {"kind": "red", "min": "30kB", "max": "90kB"},
                      "loss": {"model": "ge", "p": "1%", "r": "20%", "loss_good": "0.1%"}, "overhead": 24},
             reverse={"queue": "pie", "duplicate": "1%", "corrupt": "0.1%", "reorder": "5%", "loss": "0.5%"},
             schedule=[{"at": "1s", "forward": {"rate": "10Mbit", "queue": "drop_head"}},
                       {"at": "2s", "both": {"delay": "50ms"}, "reverse": {"loss": "none"}}], seed=9)
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(emulator_config(s, until=10)))
    out = subprocess.run([B.find_binary(), "--check-config", str(cfg_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)["settings"]
    assert resolved["a_to_b"]["qdisc"] == {"kind": "red", "min_bytes": 30000, "max_bytes": 90000, "p_max": 0.1}
    assert resolved["a_to_b"]["buffer_bytes"] == 125_000 and resolved["a_to_b"]["overhead_bytes"] == 24
    assert resolved["b_to_a"]["qdisc"]["kind"] == "pie" and resolved["b_to_a"]["jitter_dist"] == "paretonormal"
    cfg_path.write_text(json.dumps(emulator_config(spec(schedule=f"trace:{trace}"), until=3)))
    assert subprocess.run([B.find_binary(), "--check-config", str(cfg_path)], capture_output=True).returncode == 0


def test_staggered_start_keeps_the_command():
    assert staggered(["iperf3", "-c", "x"], 0) == ["iperf3", "-c", "x"]
    argv = staggered(["iperf3", "-c", "x"], 5)
    assert argv[:3] == ["sh", "-c", 'sleep 5; exec "$@"'] and argv[4:] == ["iperf3", "-c", "x"]
    assert subprocess.run(staggered(["echo", "a b"], 0.01), capture_output=True, text=True).stdout == "a b\n"


def test_each_variants_links_use_its_own_mtu(tmp_path):
    """An `mtu` sweep: every variant's receiver link is sized (bursts, default buffer, emulator frames) by the
    MTU of that variant, not by the first variant's."""
    from types import SimpleNamespace

    from vnetbench.impair.links import LinkManager
    from vnetbench.lab.environments import Variant

    groups = {Variant(env="bare", mtu=mtu): SimpleNamespace(variant=Variant(env="bare", mtu=mtu), receiver=f"r{mtu}",
                                                            senders=[f"s1{mtu}"])
              for mtu in (1500, 9000)}
    links = LinkManager(SimpleNamespace(groups=groups), registry=None, workdir=tmp_path, run_prefix="vnb-x", mtu=1500)
    assert links._mtu("r9000") == 9000 and links._mtu("s19000") == 9000 and links._mtu("r1500") == 1500
    assert links._mtu("elsewhere") == 1500


def test_the_scenario_accepts_exactly_the_registered_backends():
    from vnetbench.impair.model import BACKENDS

    assert set(BACKENDS) == {"auto", *B.REGISTRY}  # `backends` imported every backend module


def test_receive_steering_masks_and_the_end_that_gets_the_reverse_direction():
    """RPS masks as the kernel writes them (32-CPU hex words, highest first), and the steered end: what the
    emulator sends out of `a`, i.e. the host end of a sender's link (its ACKs arrive there) and the switch end
    of the receiver's link."""
    from types import SimpleNamespace

    from vnetbench.lab.splice import Splice, reverse_end, rps_mask

    assert rps_mask([0]) == "00000001" and rps_mask([0, 1, 3]) == "0000000b"
    assert rps_mask([1, 33]) == "00000002,00000002" and rps_mask([64]) == "00000001,00000000,00000000"
    host, switch = SimpleNamespace(name="eth0"), SimpleNamespace(name="s1")
    sender_link = Splice(middle=None, switch_end=switch, host_end=host, moved_name="a", original_name="s1")
    receiver_link = Splice(middle=None, switch_end=switch, host_end=host, moved_name="b", original_name="s1")
    assert reverse_end(sender_link) is host and reverse_end(receiver_link) is switch


def test_the_emulator_steers_the_hosts_receive_only_while_their_offloads_are_off(tmp_path, monkeypatch):
    """With the endpoints' offloads on, 64 KB frames have few ACKs and the hand-off costs more than it saves
    (8 flows: 11.8-12.5 Gbit/s unsteered, 7.9-8.4 steered): the steering follows the configuration's offloads,
    and says when it changed (the link's record is made again)."""
    from types import SimpleNamespace

    from vnetbench.impair.userspace import UserspaceBackend, UserspaceContext
    from vnetbench.lab import splice as S

    calls: list[str] = []
    monkeypatch.setattr(S, "steer_receive", lambda s, cpus: calls.append(f"steer {list(cpus)}") or "00000001")
    monkeypatch.setattr(S, "unsteer_receive", lambda s: calls.append("unsteer"))
    link = SimpleNamespace(name="bottleneck")
    backend = UserspaceBackend(link, context=UserspaceContext(None, tmp_path, "vnb-x-e", 1, receive_cpus=(0,)))
    assert backend.endpoints_offload(True) is False and calls == []  # not on the link yet: install() decides
    backend.splice = object()
    backend._steer()
    assert calls == [] and backend.receive_steering is None  # offloads on: where the kernel puts it
    assert backend.endpoints_offload(False) is True and backend.receive_steering == "00000001"
    assert backend.endpoints_offload(False) is False and calls == ["steer [0]"]
    assert backend.endpoints_offload(True) is True and backend.receive_steering is None and calls[-1] == "unsteer"
    # Never said (a lab that left the devices' defaults, which are on): not steered either.
    fresh = UserspaceBackend(link, context=UserspaceContext(None, tmp_path, "vnb-x-f", 1, receive_cpus=(0,)))
    fresh.splice = object()
    fresh._steer()
    assert fresh.receive_steering is None and calls[-1] == "unsteer"
    # No core to spare for the hosts: nothing to steer, whatever the offloads.
    alone = UserspaceBackend(link, context=UserspaceContext(None, tmp_path, "vnb-x-g", None))
    alone.splice = object()
    assert alone.endpoints_offload(False) is False and alone.receive_steering is None


def test_hosts_receive_on_the_cores_no_emulator_spins(tmp_path, monkeypatch):
    """Emulators get the last cores; the hosts' receive steering gets the rest, and nothing when the machine had
    no core to spare for the emulator (it then shares the hosts' and steering would only move work around)."""
    from types import SimpleNamespace

    from vnetbench.impair import links as L

    lab = SimpleNamespace(endpoints={n: SimpleNamespace(name=n, cpu=None) for n in ("r", "s1")}, groups={})
    monkeypatch.setattr(L.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    manager = L.LinkManager(lab, registry=None, workdir=tmp_path, run_prefix="vnb-x")
    manager._place_emulators(["bottleneck", "access1"])
    assert sorted(manager.emulator_cpus.values()) == [2, 3]
    assert manager._host_cpus("bottleneck") == (0, 1) and manager._host_cpus("access1") == (0, 1)
    monkeypatch.setattr(L.os, "sched_getaffinity", lambda _pid: {0})
    single = L.LinkManager(lab, registry=None, workdir=tmp_path, run_prefix="vnb-y")
    single._place_emulators(["bottleneck"])
    assert single.emulator_cpus["bottleneck"] is None and single._host_cpus("bottleneck") == ()


def test_endpoints_leave_an_emulators_core_only_while_it_is_on_their_path(monkeypatch, tmp_path):
    """Placement per configuration: the receiver gives up its core to an emulator on its path, and has it back
    in the next configuration without one (a bare reference in the same run measures as it would alone); a
    guest's QEMU keeps its cores."""
    from types import SimpleNamespace

    from vnetbench.impair import links as L

    class Guest(SimpleNamespace):
        pins_each_command = False

    hosts = {"r": SimpleNamespace(name="r", cpu=3), "s1": SimpleNamespace(name="s1", cpu=0),
             "s2": SimpleNamespace(name="s2", cpu=1), "vr": Guest(name="vr", cpu=3)}
    lab = SimpleNamespace(endpoints=hosts, groups={})
    monkeypatch.setattr(L.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    manager = L.LinkManager(lab, registry=None, workdir=tmp_path, run_prefix="vnb-x")
    manager._place_emulators(["bottleneck", "s1"])
    assert manager.emulator_cpus == {"bottleneck": 3, "s1": 2}

    def path(receiver: str, bottleneck: str | None, s1: str | None = None) -> dict[str, L.LinkTarget]:
        return {receiver: L.LinkTarget("bottleneck", bottleneck, LinkSpec()),
                "s1": L.LinkTarget("s1", s1, LinkSpec()), "s2": L.LinkTarget("s2", None, LinkSpec())}

    manager._pin(path("r", "userspace"), ["r", "s1", "s2"])
    # off core 3 onto the least used core no emulator of this path spins on (2: s1's link has no emulator here)
    assert (hosts["r"].cpu, hosts["s1"].cpu, hosts["s2"].cpu) == (2, 0, 1) and manager.repinned
    manager.repinned = False
    manager._pin(path("r", "htb"), ["r", "s1", "s2"])
    assert (hosts["r"].cpu, hosts["s1"].cpu, hosts["s2"].cpu) == (3, 0, 1) and manager.repinned
    manager.repinned = False
    manager._pin(path("r", "userspace", "userspace"), ["r", "s1", "s2"])
    assert hosts["r"].cpu in (0, 1) and (hosts["s1"].cpu, hosts["s2"].cpu) == (0, 1)
    manager._pin(path("r", "htb"), ["r", "s1", "s2"])
    assert hosts["r"].cpu == 3
    manager.repinned = False
    manager._pin(path("r", "htb"), ["r", "s1", "s2"])
    assert not manager.repinned  # nothing changed, nothing restarts
    manager._pin(path("vr", "userspace"), ["vr", "s1", "s2"])
    assert hosts["vr"].cpu == 3  # QEMU's threads stay where they started; the record says so
    manager._targets = path("r", "userspace")
    assert manager.emulator_cores() == {"bottleneck": 3}


def test_correlation_as_netem_has_it():
    """netem's `loss random P C` and `reorder P C`: the same words to netem, the same fields to the emulator,
    and one expected rate for both (model.correlated_rate runs netem's arithmetic)."""
    from vnetbench.impair.model import correlated_rate

    c = cond(loss={"model": "bernoulli", "p": "25%", "correlation": "50%"}, reorder="10%",
             reorder_correlation="25%", delay="5ms")
    args = netem.netem_args(c)
    assert args[args.index("loss"):args.index("loss") + 4] == ["loss", "random", "25%", "50%"]
    assert args[args.index("reorder"):args.index("reorder") + 3] == ["reorder", "10%", "25%"]
    assert "loss:correlation" in c.needs() and "reorder:correlation" in c.needs()
    assert {"loss:correlation", "reorder:correlation"} <= netem.NETEM_CAN
    full = settings(c)
    assert full["loss"] == {"model": "bernoulli", "p": 0.25, "correlation": 0.5}
    assert full["reorder"] == 0.1 and full["reorder_correlation"] == 0.25
    # the rate netem's correlated draws make: far below p when p is small, p at 50 % (the emulator's own
    # unit test holds its draws to these numbers)
    assert correlated_rate(0.25, 0.5) == pytest.approx(0.0698, abs=0.001)
    assert correlated_rate(0.01, 0.25) < 0.0001 and correlated_rate(0.5, 0.5) == pytest.approx(0.5, abs=0.005)
    assert correlated_rate(0.3, 0.0) == 0.3
    assert c.loss.mean_loss() == correlated_rate(0.25, 0.5)
    assert "loss bernoulli 25% correlation 50% (rate 6.98%)" in c.describe()
    assert "reorder 10% correlation 25%" in c.describe()
    # uncorrelated: as before
    plain = cond(loss="1%", reorder="5%", delay="1ms")
    assert "loss:correlation" not in plain.needs() and netem.netem_args(plain)[-2:] == ["reorder", "5%"]
    with pytest.raises(ValueError, match="correlation belongs to model"):
        cond(loss={"model": "gilbert_elliott", "p": "1%", "r": "30%", "correlation": "25%"})
