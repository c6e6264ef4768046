"""SSH hosts against real SSH servers (OpenSSH sshd), each in a namespace of its own (tests/sshlab.py).

::

    root namespace (the controller)
      198.18.200.129/25 ══ vnbtest-ssh-<pid>-1: 198.18.200.130, sshd on port 2222 (host "alpha")
      198.18.200.1/30   ══ vnbtest-ssh-<pid>-2: 198.18.200.2,   sshd on port 22 (host "beta")
      198.18.200.254: on alpha's link, nobody answers
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sshlab
from vnetbench.errors import HostError
from vnetbench.hosts.inventory import InventoryHost
from vnetbench.hosts.lock import lock_hosts
from vnetbench.hosts.ssh import (AuthenticationRefused, HostKeyChanged, HostKeyUnknown, SshConnection,
                                 Unreachable)

pytestmark = pytest.mark.lab

SRC = Path(__file__).resolve().parents[2] / "src"


class Lab:
    def __init__(self, tmp: Path, net: sshlab.SshLab):
        self.tmp = tmp
        self.net = net
        self.good_pub = sshlab.keypair(tmp / "id_good")
        sshlab.keypair(tmp / "id_wrong")
        self.other = sshlab.NON_ROOT
        ns1 = self.net.namespace("198.18.200.129/25", "198.18.200.130")
        ns2 = self.net.namespace("198.18.200.1/30", "198.18.200.2")
        self.alpha = self.net.server(ns1, "198.18.200.130", 2222, {"root": [self.good_pub]})
        users = {"root": [self.good_pub], self.other.pw_name: [self.good_pub]}
        self.beta = self.net.server(ns2, "198.18.200.2", 22, users)
        self.known_hosts = tmp / "known_hosts"
        self.known_hosts.write_text(self.alpha.known_hosts_line() + "\n" + self.beta.known_hosts_line() + "\n")
        # Instead of ~/.ssh/config: nothing of the machine's user leaks in (agent, default keys, known_hosts).
        self.ssh_config = tmp / "ssh_config"
        self.ssh_config.write_text(f"Host *\n  UserKnownHostsFile {self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
                                   f"  IdentityAgent none\n  IdentitiesOnly yes\n")

    def host(self, name: str = "alpha", key: str = "id_good", user: str = "root", address: str | None = None,
             port: int | None = None) -> InventoryHost:
        server = self.alpha if name == "alpha" else self.beta
        return InventoryHost(name, address or server.address, user=user, port=port or server.port,
                             private_key_file=str(self.tmp / key))

    def connect(self, host: InventoryHost, **kw) -> SshConnection:
        kw.setdefault("config_file", self.ssh_config)
        kw.setdefault("connect_timeout", 5)
        return SshConnection(host, **kw)

    def logins(self, server: sshlab.Server) -> int:
        return server.log.read_text().count("Accepted publickey")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ssh")
    os.chmod(tmp, 0o755)  # the non-root user's session must reach its mounted home only; harmless
    net = sshlab.SshLab(tmp)  # registers each namespace as it is made: closed even if building fails
    try:
        yield Lab(tmp, net)
    finally:
        net.close()
    assert not _ours(), f"namespaces left behind: {_ours()}"


def _ours() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(sshlab.PREFIX + "-")]


def test_command_output_and_exit_status_come_back(lab):
    with lab.connect(lab.host()) as c:
        done = c.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")


def test_hostile_arguments_arrive_literally(lab, tmp_path):
    marker = tmp_path / "pwned"
    hostile = [f"$(touch {marker})", f"; touch {marker}", f"`touch {marker}`", f"' ; touch {marker}; '",
               f'" ; touch {marker}; "', f"a\ntouch {marker}", "☃ ünïcödé \t tab", "$HOME", "*", "~", "-n", "",
               "a\\b", f"| touch {marker}", f"&& touch {marker}"]
    with lab.connect(lab.host()) as c:
        done = c.run(["printf", "%s\\0", *hostile])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\0")[:-1] == hostile
    assert not marker.exists()


def test_one_master_connection_serves_every_command(lab):
    before = lab.logins(lab.alpha)
    with lab.connect(lab.host()) as c:
        for i in range(5):
            assert c.run(["echo", str(i)]).stdout == f"{i}\n"
        masters = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(
            f"ssh: {c.control_dir}/")]
        assert len(masters) == 1, masters
        assert c.master_running()
        assert oct(c.control_dir.stat().st_mode & 0o777) == "0o700"
        control_dir = c.control_dir
    assert lab.logins(lab.alpha) - before == 1  # one authentication for five commands
    assert not control_dir.exists()
    time.sleep(0.2)
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(control_dir) in _cmdline(p)]


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_unknown_host_key_is_refused_by_default(lab, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    with lab.connect(lab.host(), known_hosts_file=kh) as c, pytest.raises(HostKeyUnknown) as e:
        c.run(["true"])
    msg = str(e.value)
    assert "host alpha (root@198.18.200.130 port 2222)" in msg
    assert f"not in {kh}" in msg and "--accept-new-host-keys" in msg and "ssh-keyscan -p 2222" in msg
    assert kh.read_text() == ""


def test_accept_new_adds_the_key_then_checks_it(lab, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    with lab.connect(lab.host(), known_hosts_file=kh, accept_new_host_keys=True) as c:
        assert c.run(["echo", "hi"]).stdout == "hi\n"
    assert lab.alpha.host_public_key in kh.read_text()
    assert "[198.18.200.130]:2222" in kh.read_text()
    with lab.connect(lab.host(), known_hosts_file=kh) as c:  # strict again: the accepted key is now known
        assert c.run(["true"]).returncode == 0


def test_changed_host_key_is_refused_even_with_accept_new(lab, tmp_path):
    other = sshlab.host_key(tmp_path / "impostor_key")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[198.18.200.130]:2222 {other}\n")
    for accept in (False, True):
        with lab.connect(lab.host(), known_hosts_file=kh, accept_new_host_keys=accept) as c, \
                pytest.raises(HostKeyChanged) as e:
            c.run(["true"])
        msg = str(e.value)
        assert "host alpha" in msg and "CHANGED" in msg and f"{kh} line 1" in msg
        assert f"ssh-keygen -f {kh} -R '[198.18.200.130]:2222'" in msg


def test_wrong_key_gives_the_authentication_message(lab):
    with lab.connect(lab.host(key="id_wrong")) as c, pytest.raises(AuthenticationRefused) as e:
        c.run(["true"])
    msg = str(e.value)
    assert "host alpha (root@198.18.200.130 port 2222): authentication refused" in msg
    assert f"ssh-copy-id -i {lab.tmp / 'id_wrong'} -p 2222 root@198.18.200.130" in msg


def test_nobody_answering_is_unreachable_within_the_timeout(lab):
    t0 = time.monotonic()
    with lab.connect(lab.host(name="ghost", address="198.18.200.254", port=22), connect_timeout=2) as c, \
            pytest.raises(Unreachable) as e:
        c.run(["true"])
    assert time.monotonic() - t0 < 2 + 2.5
    assert "host ghost (root@198.18.200.254 port 22): unreachable" in str(e.value)


def test_privileges_root_and_not(lab):
    with lab.connect(lab.host("beta")) as c:
        p = c.privileges()
        assert (p.user, p.root, p.ok) == ("root", True, True)
        assert c.command(["tc", "qdisc", "show"], root=True)[-1] == "tc qdisc show"  # root: no sudo
    with lab.connect(lab.host("beta", user=lab.other.pw_name)) as c:
        p = c.privileges()
        assert (p.user, p.root, p.sudo, p.ok) == (lab.other.pw_name, False, False, False)
        assert c.command(["tc", "qdisc", "show"], root=True)[-1] == "sudo -n -- tc qdisc show"


def test_the_run_lock_is_kept_where_only_the_remote_user_can_write(lab):
    """Root's in /run/vnetbench-hosts (0700, root's), another user's in a directory of its own (its home's cache, as
    the tests' user has no login session of logind's): both held over ssh and let go with the session."""
    as_root = lock_hosts([lab.host("alpha")], lab.connect, "run R")
    as_user = lock_hosts([lab.host("beta", user=lab.other.pw_name)], lab.connect, "run U")
    try:
        mine = Path(as_root.files["alpha"])
        assert str(mine) == sshlab.lock_file(lab.alpha.ns) and mine.with_name(mine.name + ".owner").read_text() == "run R\n"
        st = os.stat(mine.parent, follow_symlinks=False)
        assert (st.st_uid, oct(st.st_mode & 0o7777)) == (0, "0o700")
        theirs = as_user.files["beta"]
        assert "/.cache/vnetbench-hosts-" in theirs and theirs.endswith(".lock"), theirs
        with lab.connect(lab.host("beta", user=lab.other.pw_name)) as c:
            d = theirs.rsplit("/", 1)[0]
            shown = c.run(["sh", "-c", 'stat -c "%u %a" "$1"; cat "$2.owner"', "sh", d, theirs]).stdout
        assert shown.splitlines() == [f"{lab.other.pw_uid} 700", "run U"], shown
    finally:
        as_root.release()
        as_user.release()
    assert not mine.with_name(mine.name + ".owner").exists()


def test_a_fifo_at_the_lock_file_is_refused_at_once_naming_it(lab):
    """Only root can put anything in /run/vnetbench-hosts; whatever is at the lock's name that is not a regular file is
    refused, not opened (opening a FIFO would wait for a writer for ever), in one line naming the file."""
    fifo = Path(sshlab.lock_file(lab.alpha.ns))
    fifo.parent.mkdir(mode=0o700, exist_ok=True)
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    try:
        t0 = time.monotonic()
        with pytest.raises(HostError) as e:
            lock_hosts([lab.host("alpha")], lab.connect, "run F")
        assert time.monotonic() - t0 < 10
    finally:
        fifo.unlink()
    said = str(e.value)
    assert "\n" not in said and said == (f"host alpha (root@198.18.200.130 port 2222): could not take the host's run "
                                         f"lock: {fifo} is not a regular file; remove it (vnetbench makes it again)")


def _doctor(lab, inventory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vnetbench", "doctor", "--hosts", str(inventory), "--ssh-config",
                           str(lab.ssh_config), "--connect-timeout", "5"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"})


def _inventory(lab, path: Path, beta_user: str) -> Path:
    path.write_text(f"""\
all:
  vars:
    ansible_ssh_private_key_file: {lab.tmp / 'id_good'}
  children:
    bench:
      hosts:
        alpha:
          ansible_host: 198.18.200.130
          ansible_port: 2222
          ansible_user: root
          vnetbench_shape_interfaces: [eth0]
        beta:
          ansible_host: 198.18.200.2
          ansible_user: {beta_user}
""")
    return path


def test_doctor_hosts_ready(lab, tmp_path):
    done = _doctor(lab, _inventory(lab, tmp_path / "inv.yml", "root"))
    assert done.returncode == 0, done.stdout + done.stderr
    header = next(line for line in done.stdout.splitlines() if "check" in line)
    assert "alpha" in header and "beta" in header
    for row in ("reachable", "authenticated", "privileges", "kernel", "cpus", "tcp congestion control",
                "qdisc netem", "tool iperf3", "tool ip"):
        assert row in done.stdout, row
    assert "root is root" in done.stdout
    assert "2 of 2 hosts ready" in done.stdout
    conditions = " ".join(next(line for line in done.stdout.splitlines() if "link conditions" in line).split())
    assert "on eth0" in conditions and "not opted in" in conditions  # alpha opted eth0 in, beta nothing


def test_doctor_hosts_not_ready_names_the_fix(lab, tmp_path):
    done = _doctor(lab, _inventory(lab, tmp_path / "inv.yml", lab.other.pw_name))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 of 2 hosts ready; not ready: beta" in done.stdout
    assert "needed: beta: privileges:" in done.stdout
    assert f"{lab.other.pw_name} ALL=(root) NOPASSWD: ALL" in done.stdout.replace("\n", "")


def test_doctor_hosts_unknown_key_then_accept_new(lab, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(lab.ssh_config.read_text().replace(str(lab.known_hosts), str(kh)))
    inv = _inventory(lab, tmp_path / "inv.yml", "root")
    argv = [sys.executable, "-m", "vnetbench", "doctor", "--hosts", str(inv), "--ssh-config", str(cfg)]
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    first = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 1 and "needed: alpha: host key:" in first.stdout, first.stdout
    second = subprocess.run([*argv, "--accept-new-host-keys"], capture_output=True, text=True, timeout=120, env=env)
    assert second.returncode == 0, second.stdout
    assert lab.alpha.host_public_key in kh.read_text() and lab.beta.host_public_key in kh.read_text()
