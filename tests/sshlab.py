"""Real SSH servers for tests: dropbear, each in its own network namespace, with keys made for the test.

::

    root namespace                          vnbtest-ssh-<pid>-<n>
    vts<pid>n  198.18.200.x/prefix  ══ veth ══  eth0 198.18.200.y  dropbear -p y:port

Nothing outside the test's temp dir is touched: dropbear gets its host key with -r, and the user's
authorized_keys comes from a temp home bind-mounted over the user's home in a mount namespace of dropbear's
own (the real home and ~/.ssh are never read or written), where a copy of /etc/passwd also holds the tests'
non-root user (the machine's users are never changed). Clients get a known_hosts file in the temp dir.
dropbear rather than OpenSSH's sshd: Debian's openssh-server package starts a system sshd on port 22.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = f"vnbtest-ssh-{os.getpid()}"


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, **kw)


def keypair(path: Path) -> str:
    """An ed25519 client key (OpenSSH format, no passphrase); returns the public key line."""
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path))
    return (path.parent / f"{path.name}.pub").read_text().strip()


def host_key(path: Path) -> str:
    """A dropbear ed25519 host key; returns its public key ("ssh-ed25519 AAAA...")."""
    out = sh("dropbearkey", "-t", "ed25519", "-f", str(path)).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("ssh-ed25519 "))
    return " ".join(line.split()[:2])


@dataclass(frozen=True)
class TestUser:
    """A user that exists only for the servers: an entry in a copy of /etc/passwd that dropbear sees in its own
    mount namespace (the machine's users are neither needed nor touched)."""

    pw_name: str = "vnbtest"
    pw_uid: int = 64242
    pw_gid: int = 64242


NON_ROOT = TestUser()


@dataclass
class Server:
    ns: str
    address: str
    port: int
    host_public_key: str
    proc: subprocess.Popen
    log: Path

    def known_hosts_line(self) -> str:
        target = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{target} {self.host_public_key}"


@dataclass
class SshLab:
    tmp: Path
    n: int = 0
    namespaces: list[str] = field(default_factory=list)
    servers: list[Server] = field(default_factory=list)
    homes: list[Path] = field(default_factory=list)

    def namespace(self, root_addr: str, ns_addr: str) -> str:
        """A namespace joined to the root namespace by a veth: root_addr (with prefix) here, ns_addr there."""
        self.n += 1
        name = f"{PREFIX}-{self.n}"
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)  # registered before anything else can fail
        outer = f"vts{os.getpid() % 100000}{self.n}"
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", name)
        sh("ip", "addr", "add", root_addr, "dev", outer)
        sh("ip", "link", "set", outer, "up")
        prefix = root_addr.split("/")[1]
        sh("ip", "-n", name, "addr", "add", f"{ns_addr}/{prefix}", "dev", "eth0")
        sh("ip", "-n", name, "link", "set", "eth0", "up")
        sh("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def server(self, ns: str, address: str, port: int, authorized: dict[str, list[str]],
               hidden: tuple[str, ...] = ()) -> Server:
        """dropbear in ``ns`` on address:port, letting in the given public keys for each user name; the
        files in ``hidden`` (a tool's binary) are /dev/null for its sessions, as on a host without them."""
        d = self.tmp / f"server-{len(self.servers) + 1}"
        binds: list[str] = []
        d.mkdir(parents=True)
        passwd = Path("/etc/passwd").read_text()
        for name, keys in authorized.items():
            home = d / f"home-{name}"
            if name == NON_ROOT.pw_name:
                # The test's own user: its home is a temp dir of its own outside pytest's (which is root's,
                # mode 0700, and dropbear reads authorized_keys as the user).
                home = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-home-"))
                os.chmod(home, 0o755)
                self.homes.append(home)
                uid, gid, real_home = NON_ROOT.pw_uid, NON_ROOT.pw_gid, str(home)
                passwd += f"{name}:*:{uid}:{gid}:vnetbench test user:{home}:/bin/sh\n"
            else:
                user = pwd.getpwnam(name)
                uid, gid, real_home = user.pw_uid, user.pw_gid, user.pw_dir
            (home / ".ssh").mkdir(parents=True, exist_ok=False)
            (home / ".ssh" / "authorized_keys").write_text("".join(k + "\n" for k in keys))
            for p in (home, home / ".ssh", home / ".ssh" / "authorized_keys"):
                os.chown(p, uid, gid)
                os.chmod(p, 0o600 if p.is_file() else 0o700)
            if real_home != str(home):
                binds += [str(home), real_home]
        (d / "passwd").write_text(passwd)
        os.chmod(d / "passwd", 0o644)
        binds += [str(d / "passwd"), "/etc/passwd"]
        for path in hidden:
            binds += ["/dev/null", path]
        public = host_key(d / "host_key")
        log = d / "dropbear.log"
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        # The count of (temp home, real home) pairs, the pairs, then dropbear's argv: each temp home is
        # mounted over the real one, in this mount namespace only.
        script = ('n=$1; shift; while [ "$n" -gt 0 ]; do mount --bind "$1" "$2" || exit 1; shift 2; n=$((n-1)); '
                  'done; exec "$@"')
        argv = ["ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private",
                "sh", "-c", script, "sh", str(len(binds) // 2), *binds,
                "/usr/sbin/dropbear", "-F", "-E", "-s", "-m", "-r", str(d / "host_key"), "-p", f"{address}:{port}",
                "-P", str(d / "dropbear.pid")]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        server = Server(ns, address, port, public, proc, log)
        self.servers.append(server)
        deadline = time.monotonic() + 10
        while True:  # listening, checked, not slept on
            try:
                socket.create_connection((address, port), timeout=0.5).close()
                return server
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dropbear did not start: {log.read_text()}")
                time.sleep(0.05)

    def close(self) -> None:
        for s in self.servers:
            if s.proc.poll() is None:
                os.killpg(s.proc.pid, signal.SIGTERM)
                try:
                    s.proc.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(s.proc.pid, signal.SIGKILL)
                    s.proc.wait(5)
        for ns in self.namespaces:
            # dropbear's per-connection children: started by this test, in this test's namespace.
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for home in self.homes:
            shutil.rmtree(home, ignore_errors=True)
