"""Remote commands are argument lists quoted once for the remote shell; ssh's failures read for people."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vnetbench.hosts.inventory import InventoryHost
from vnetbench.hosts.ssh import (AuthenticationRefused, HostKeyChanged, HostKeyUnknown, SshConnection, Unreachable,
                                 remote_command)

HOSTILE = ["$(touch /tmp/vnbtest-pwned)", "; rm -rf /", "`id`", "it's", 'say "hi"', "a\nb", "line\r\n", "☃ ünï",
           "$HOME", "*", "~root", "-n", "", " ", "a\\b", "|", "&&", "#comment", "{a,b}", "x=1", "\t"]


def remote_sh(argv: list[str]) -> list[str]:
    """What a POSIX login shell hands the command: run the quoted line through sh, as sshd does."""
    out = subprocess.run(["sh", "-c", remote_command(["printf", "%s\\0", *argv])], capture_output=True, timeout=5)
    assert out.returncode == 0
    return out.stdout.decode().split("\0")[:-1]


def test_hostile_arguments_round_trip_through_sh(tmp_path):
    assert remote_sh(HOSTILE) == HOSTILE
    assert shlex.split(remote_command(HOSTILE)) == HOSTILE


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20),
                min_size=1, max_size=6))  # printf with no argument prints its format once
def test_any_text_round_trips(argv):
    assert remote_sh(argv) == argv


def host(**kw) -> InventoryHost:
    return InventoryHost(**{"name": "srv", "address": "198.18.0.10", "user": "bench", "port": 2222, **kw})


def test_the_ssh_command_line():
    c = SshConnection(host(private_key_file="/k"), accept_new_host_keys=False, known_hosts_file="/kh")
    try:
        argv = c.command(["echo", "a b", "$(x)"])
        opts = " ".join(argv)
        assert "BatchMode=yes" in opts and "StrictHostKeyChecking=yes" in opts and "ControlMaster=auto" in opts
        assert f"ControlPath={c.control_dir}/%C" in opts and "ControlPersist=" in opts
        assert "UserKnownHostsFile=/kh" in opts and "-l bench" in opts and "-p 2222" in opts and "-i /k" in opts
        # the address after "--", so an address starting with "-" is never an option; the command as one string
        assert argv[-3:] == ["--", "198.18.0.10", "echo 'a b' '$(x)'"]
        assert oct(c.control_dir.stat().st_mode & 0o777) == "0o700"
    finally:
        c.close()
    assert not c.control_dir.exists()
    with SshConnection(host(), accept_new_host_keys=True) as c:
        assert "StrictHostKeyChecking=accept-new" in c.command(["true"])
        assert not any("StrictHostKeyChecking=no" in a for a in c.command(["true"]))
    # A host that stops answering is given up after 30 s, not TCP's quarter of an hour.
    with SshConnection(host()) as c:
        opts = " ".join(c.command(["true"]))
        assert "ServerAliveInterval=10" in opts and "ServerAliveCountMax=3" in opts


def test_a_guest_is_reached_from_its_namespace():
    """A guest's connection is made in the namespace its QEMU runs in (`via`); the commands multiplexed on it
    are the same argument lists, quoted once."""
    with SshConnection(host(address="198.19.0.2", port=22), via=["ip", "netns", "exec", "vnb-x-h1"]) as c:
        argv = c.command(["/bin/vnb-run", "-c", "1", "iperf3", "-s", "$(x)"])
        assert argv[:4] == ["ip", "netns", "exec", "vnb-x-h1"] and argv[4] == "ssh"
        assert argv[-1] == "/bin/vnb-run -c 1 iperf3 -s '$(x)'"
    # dropbear is not multiplexed on (hosts/ssh.py says why): a connection per command.
    with SshConnection(host(address="198.19.0.2", port=22), multiplex=False) as c:
        opts = " ".join(c.command(["true"]))
        assert "ControlMaster=no" in opts and "ControlPath=none" in opts and "ControlPersist" not in opts
        assert c.control_dir is None  # no master, no socket directory to make or remove


# ssh's own words (OpenSSH 9.2), as the integration tests see them from a real server.
UNKNOWN = ("No ED25519 host key is known for [198.18.0.10]:2222 and you have requested strict checking.\r\n"
           "Host key verification failed.\r\n")
CHANGED = ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
           "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
           "Offending ED25519 key in /tmp/kh:3\n"
           "Host key for [198.18.0.10]:2222 has changed and you have requested strict checking.\n"
           "Host key verification failed.\n")
DENIED = "bench@198.18.0.10: Permission denied (publickey).\r\n"
TIMEOUT = "ssh: connect to host 198.18.0.10 port 2222: Connection timed out\r\n"
REFUSED = "ssh: connect to host 198.18.0.10 port 2222: Connection refused\r\n"


@pytest.mark.parametrize("stderr, kind, words", [
    (UNKNOWN, HostKeyUnknown, ["not in /kh", "ssh-keyscan -p 2222 198.18.0.10 >> /kh", "--accept-new-host-keys"]),
    (CHANGED, HostKeyChanged, ["CHANGED", "/tmp/kh line 3", "ssh-keygen -f /kh -R '[198.18.0.10]:2222'"]),
    (DENIED, AuthenticationRefused, ["authentication refused", "ssh-copy-id -p 2222 bench@198.18.0.10"]),
    (TIMEOUT, Unreachable, ["unreachable, timed out"]),
    (REFUSED, Unreachable, ["unreachable, connection refused"]),
])
def test_ssh_failures_name_host_address_and_fix(stderr, kind, words):
    with SshConnection(host(), known_hosts_file="/kh") as c:
        e = c.failure(stderr)
    assert type(e) is kind
    assert str(e).startswith("host srv (bench@198.18.0.10 port 2222): ")
    for w in words:
        assert w in str(e)
    assert "\n" not in str(e)


def test_a_remote_command_exiting_255_is_not_an_ssh_failure():
    with SshConnection(host()) as c:
        assert c.failure("my tool: something went wrong\n") is None


# ------------------------------------------------------------------ issue 33, item 10


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client (ssh -G)")
def test_no_agent_x11_or_port_forwarding_whatever_the_users_config_says(tmp_path):
    """A benchmark host's root could use a forwarded agent or display as the controller's user: ssh's own
    reading of the options (`ssh -G`) over a config that forwards everything shows none of it."""
    config = tmp_path / "config"
    config.write_text("Host *\n  ForwardAgent yes\n  ForwardX11 yes\n  ForwardX11Trusted yes\n"
                      "  LocalForward 15432 localhost:5432\n  RemoteForward 15433 localhost:22\n  DynamicForward 1080\n")
    with SshConnection(host(), config_file=config) as c:
        effective = subprocess.run(["ssh", *c.options(), "-G", "--", c.host.address], capture_output=True,
                                   text=True, timeout=10).stdout.splitlines()
    assert "forwardagent no" in effective and "forwardx11 no" in effective
    assert "clearallforwardings yes" in effective
    assert not [line for line in effective if line.startswith(("localforward", "remoteforward", "dynamicforward"))]


def test_a_host_answering_without_end_is_stopped_at_the_limit(tmp_path, monkeypatch):
    """A 200 MB answer took 606 MiB: what a host answers is read up to limits.REMOTE_OUTPUT_BYTES, then the
    command is stopped and the host named."""
    import time
    import tracemalloc

    from vnetbench.errors import HostError
    from vnetbench.hosts import ssh as S
    from vnetbench.lab.nodes import OutputTooLarge, bounded_run
    from vnetbench.limits import Limit

    fake = tmp_path / "ssh"  # an "ssh" whose host answers 64 MiB to anything
    fake.write_text("#!/bin/sh\nexec head -c 67108864 /dev/zero\n")
    fake.chmod(0o755)
    monkeypatch.setattr(S, "REMOTE_OUTPUT_BYTES", Limit("remote output", 2**20, "bytes"))
    tracemalloc.start()
    started = time.monotonic()
    try:
        with SshConnection(host(), ssh=str(fake)) as c, pytest.raises(HostError) as refused:
            c.run(["cat", "/var/log/huge"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "host srv (bench@198.18.0.10 port 2222): `cat /var/log/huge` answered more than the remote output " \
           "limit of 1 MiB" in str(refused.value)
    assert peak < 8 * 2**20 and time.monotonic() - started < 30, peak
    # the same for a node's run() on a host (SshNode), and errors beyond the limit as well as output
    with pytest.raises(OutputTooLarge, match="more than 1 MiB of error output"):
        bounded_run(["sh", "-c", "head -c 3000000 /dev/zero >&2"], 30, 2**20)
    done = bounded_run(["sh", "-c", "printf 'ok\\377'; echo err >&2; exit 3"], 30, 2**20)
    assert (done.returncode, done.stdout, done.stderr) == (3, "ok\ufffd", "err\n")
    with pytest.raises(subprocess.TimeoutExpired):
        bounded_run(["sleep", "5"], 0.5, 2**20)


def test_printed_fix_commands_are_quoted():
    """A command the user is told to run holds the host's address, user, key and files as single words."""
    odd = host(address="odd$(touch x)host", user="us er", private_key_file="/keys/my key")
    with SshConnection(odd, known_hosts_file="/tmp/known hosts") as c:
        texts = [str(c.failure(s)) for s in (UNKNOWN, CHANGED, DENIED, REFUSED)]
    commands = [part for t in texts for part in t.split("`")[1::2]]
    assert len(commands) == 4, texts
    assert shlex.split(commands[0]) == ["ssh-keyscan", "-p", "2222", "odd$(touch x)host", ">>", "/tmp/known hosts"]
    assert shlex.split(commands[1]) == ["ssh-keygen", "-f", "/tmp/known hosts", "-R", "[odd$(touch x)host]:2222"]
    assert shlex.split(commands[2]) == ["ssh-copy-id", "-i", "/keys/my key", "-p", "2222", "us er@odd$(touch x)host"]
    assert shlex.split(commands[3]) == ["ssh", "-v", "-p", "2222", "us er@odd$(touch x)host"]
