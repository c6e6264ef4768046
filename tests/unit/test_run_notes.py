"""What `show` and the report say about a run from its fingerprint (runner/fingerprint.py run_notes)."""

from __future__ import annotations


def test_show_and_the_report_say_when_idle_cores_halted_and_what_a_wake_up_cost():
    from vnetbench.runner.fingerprint import idle_note, run_notes

    woke = {"asleep_us": 5000, "wake_us_at_once": 14.2, "wake_us_after_sleep": 96.4}
    driverless = {"cpu_wake_latency": "not held: the kernel has no cpuidle driver, through which ...",
                  "cpu_wake_up": woke}
    assert idle_note(driverless) == (
        "Idle cores halted while the lab was up (the kernel has no cpuidle driver): a process woken after 5 ms "
        "asleep started 96 us late (14 us just asleep), which a round trip through a delay pays twice; "
        'lab.idle_cores = "poll" keeps them polling.')
    assert idle_note(driverless) in run_notes(driverless)
    refused = {"cpu_wake_latency": "not held: /dev/cpu_dma_latency: Permission denied", "cpu_wake_up": woke}
    assert idle_note(refused).startswith("Idle cores halted while the lab was up (/dev/cpu_dma_latency: Permission denied)")
    assert "poll" not in idle_note(refused)  # polling acts only where there is no driver
    # held, measured nowhere (real hosts), or an older run's record: nothing to say
    assert idle_note({**driverless, "cpu_wake_latency": "held at 0 us while the lab was up (...)"}) is None
    assert idle_note({"cpu_wake_latency": "not held: the endpoints are not this machine's (real hosts)",
                      "cpu_wake_up": None}) is None
    assert idle_note({}) is None
    assert idle_note({**driverless, "cpu_wake_up": {"error": "vnb-link: no second core"}}) is None
