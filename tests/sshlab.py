"""Real SSH servers for tests: OpenSSH's sshd (Debian's openssh-server), each in its own network namespace,
with keys made for the test.

::

    root namespace                          vnbtest-ssh-<pid>-<n>
    vts<pid>n  198.18.200.x/prefix  ══ veth ══  eth0 198.18.200.y  sshd -D -f <its config>, ListenAddress y:port

Each sshd runs with Debian's own settings (UsePAM, its PAM stack, key authentication) and a config file of
its own in the test's temp dir: its host key, its address, its pid file. Nothing else outside the temp dir is
touched but /run/sshd, sshd's privilege separation directory, made as the package's service makes it. The
user's authorized_keys comes from a temp home bind-mounted over the user's home in a mount namespace of
sshd's own (the real home and ~/.ssh are never read or written), where a copy of /etc/passwd also holds the
tests' non-root user (the machine's users are never changed). Clients get a known_hosts file in the temp dir.
`make setup` installs openssh-server without starting or enabling the machine's own sshd.
"""

from __future__ import annotations

import itertools
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
_SERIAL = itertools.count(1)


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, **kw)


def keypair(path: Path) -> str:
    """An ed25519 client key (OpenSSH format, no passphrase); returns the public key line."""
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path))
    return (path.parent / f"{path.name}.pub").read_text().strip()


def host_key(path: Path) -> str:
    """An ed25519 host key for sshd; returns its public key ("ssh-ed25519 AAAA...")."""
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path))
    return " ".join((path.parent / f"{path.name}.pub").read_text().split()[:2])


# Debian's /etc/ssh/sshd_config, less what a test server must not share with the machine's (its Include of
# sshd_config.d, X11 and sftp), plus the server's own key, address and pid file.
SSHD_CONFIG = """\
HostKey {host_key}
ListenAddress {address}:{port}
PidFile {pid_file}
KbdInteractiveAuthentication no
PasswordAuthentication no
UsePAM yes
PrintMotd no
AcceptEnv LANG LC_*
"""


@dataclass(frozen=True)
class TestUser:
    """A user that exists only for the servers: an entry in a copy of /etc/passwd that sshd sees in its own
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
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

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
        # Numbered across every SshLab of the process: a namespace's removal is finished by the kernel
        # asynchronously, so the root end of a veth of a lab just closed can still hold its name for a moment.
        self.n = next(_SERIAL)
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
        """sshd in ``ns`` on address:port, letting in the given public keys for each user name; the
        files in ``hidden`` (a tool's binary) are /dev/null for its sessions, as on a host without them."""
        d = self.tmp / f"server-{len(self.servers) + 1}"
        binds: list[str] = []
        d.mkdir(parents=True)
        passwd = Path("/etc/passwd").read_text()
        for name, keys in authorized.items():
            home = d / f"home-{name}"
            if name == NON_ROOT.pw_name:
                # The test's own user: its home is a temp dir of its own outside pytest's (which is root's,
                # mode 0700, and sshd checks the modes of authorized_keys and every directory above it).
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
        (d / "sshd_config").write_text(SSHD_CONFIG.format(host_key=d / "host_key", address=address, port=port,
                                                          pid_file=d / "sshd.pid"))
        # sshd's privilege separation directory, which Debian's service makes at each start (RuntimeDirectory).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        log = d / "sshd.log"
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        # The count of (temp home, real home) pairs, the pairs, then sshd's argv: each temp home is
        # mounted over the real one, in this mount namespace only. sshd by its full path: it re-executes itself.
        script = ('n=$1; shift; while [ "$n" -gt 0 ]; do mount --bind "$1" "$2" || exit 1; shift 2; n=$((n-1)); '
                  'done; exec "$@"')
        argv = ["ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private",
                "sh", "-c", script, "sh", str(len(binds) // 2), *binds,
                "/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")]
        server = Server(ns, address, port, public, None, log, argv, env)  # type: ignore[arg-type]
        self.servers.append(server)
        return self.start(server)

    def crash(self, server: Server) -> None:
        """The host goes down: its sshd and every process in its namespace are killed at once."""
        pids = subprocess.run(["ip", "netns", "pids", server.ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        server.proc.wait(10)

    def start(self, server: Server) -> Server:
        """(Re)start the server's sshd, with its host key: a host that comes back."""
        with open(server.log, "ab") as out:
            proc = subprocess.Popen(server.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=server.env, start_new_session=True)
        server.proc = proc
        address, port, log = server.address, server.port, server.log
        deadline = time.monotonic() + 10
        while True:  # listening, checked, not slept on
            try:
                socket.create_connection((address, port), timeout=0.5).close()
                return server
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sshd did not start: {log.read_text()}")
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
            # The run lock file vnetbench made for this "host" as root (hosts/lock.py: named after its network
            # namespace, which goes now): a real host keeps its lock file, as lock files are kept. A non-root
            # user's is in its home, removed below.
            try:
                Path(lock_file(ns)).unlink(missing_ok=True)
            except OSError:
                pass
            # sshd's per-connection children: started by this test, in this test's namespace.
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for home in self.homes:
            shutil.rmtree(home, ignore_errors=True)


def lock_file(ns: str) -> str:
    """The run lock file of the host that is namespace `ns`, for root (hosts/lock.py)."""
    return f"/run/vnetbench-hosts/net{os.stat(f'/run/netns/{ns}').st_ino}.lock"


class DataHosts:
    """Three hosts for `run --hosts` (tests and bench/remote.py): server-a, client-1 and client-2 with a data
    network between them beside their management links; client-2's sessions find no sockperf. The data network is routed through a namespace of its own, as a switch or router between real
    machines: packets reach a host from a wire, not straight from the other host's socket (across a bare
    veth the kernel keeps the sender's socket on a packet, and a queue on the receiver's ingress would push
    back on the sender as a local one does). server-a lets vnetbench change data0 (link conditions)."""

    SERVER_DATA, CLIENT_DATA, CLIENT2_DATA = "198.18.205.1", "198.18.205.6", "198.18.205.10"
    SHAPED = "data0"

    def __init__(self, tmp: Path, net: SshLab, extra_clients: int = 0):
        """`extra_clients` more hosts on the data network, client-3..., all tools (bench/remote.py's spread)."""
        self.tmp, self.net = tmp, net
        pub = keypair(tmp / "id_run")
        self.ns_a = net.namespace("198.18.204.1/30", "198.18.204.2")
        self.ns_b = net.namespace("198.18.204.5/30", "198.18.204.6")
        self.ns_c = net.namespace("198.18.204.9/30", "198.18.204.10")
        # The data network, between the hosts only (the controller never sends on it): a router between
        # server-a (198.18.205.0/30), client-1 (198.18.205.4/30) and client-2 (198.18.205.8/30).
        self.router = f"{PREFIX}-{next(_SERIAL)}"
        sh("ip", "netns", "add", self.router)
        net.namespaces.append(self.router)
        sh("ip", "netns", "exec", self.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh("ip", "-n", self.router, "link", "set", "lo", "up")
        for ns, mine, theirs, port in ((self.ns_a, self.SERVER_DATA, "198.18.205.2", "ra"),
                                       (self.ns_b, self.CLIENT_DATA, "198.18.205.5", "rb"),
                                       (self.ns_c, self.CLIENT2_DATA, "198.18.205.9", "rc")):
            sh("ip", "link", "add", "data0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.router)
            sh("ip", "-n", ns, "addr", "add", f"{mine}/30", "dev", "data0")
            sh("ip", "-n", ns, "link", "set", "data0", "up")
            sh("ip", "-n", self.router, "addr", "add", f"{theirs}/30", "dev", port)
            sh("ip", "-n", self.router, "link", "set", port, "up")
            sh("ip", "-n", ns, "route", "add", "198.18.205.0/24", "via", theirs)
        self.a = net.server(self.ns_a, "198.18.204.2", 22, {"root": [pub]})
        self.b = net.server(self.ns_b, "198.18.204.6", 22, {"root": [pub]})
        # A third host, whose sessions find no sockperf.
        self.c = net.server(self.ns_c, "198.18.204.10", 22, {"root": [pub]}, hidden=(shutil.which("sockperf"),))
        self.extra: dict[str, tuple[Server, str]] = {}  # name -> (server, data address)
        for i in range(extra_clients):
            base = 12 + 4 * i  # management 198.18.204.<base>/30 and data 198.18.205.<base>/30
            ns = net.namespace(f"198.18.204.{base + 1}/30", f"198.18.204.{base + 2}")
            data = f"198.18.205.{base + 2}"
            sh("ip", "link", "add", "data0", "netns", ns, "type", "veth", "peer", "name", f"r{i}", "netns", self.router)
            sh("ip", "-n", ns, "addr", "add", f"{data}/30", "dev", "data0")
            sh("ip", "-n", ns, "link", "set", "data0", "up")
            sh("ip", "-n", self.router, "addr", "add", f"198.18.205.{base + 1}/30", "dev", f"r{i}")
            sh("ip", "-n", self.router, "link", "set", f"r{i}", "up")
            sh("ip", "-n", ns, "route", "add", "198.18.205.0/24", "via", f"198.18.205.{base + 1}")
            self.extra[f"client-{3 + i}"] = (net.server(ns, f"198.18.204.{base + 2}", 22, {"root": [pub]}), data)
        known = tmp / "known_hosts"
        known.write_text("".join(s.known_hosts_line() + "\n"
                                 for s in (self.a, self.b, self.c, *(srv for srv, _ in self.extra.values()))))
        self.ssh_config = tmp / "ssh_config"
        self.ssh_config.write_text(f"Host *\n  UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n"
                                   "  IdentityAgent none\n  IdentitiesOnly yes\n")
        self.inventory = tmp / "inventory.yml"
        self.inventory.write_text(self.inventory_text())

    def inventory_text(self, shape: str = SHAPED, client_shape: str = "", lacking_shape: str = "") -> str:
        """The inventory, with server-a's (and client-1's, client-2's) vnetbench_shape_interfaces (none when
        empty)."""
        def opt_in(name: str) -> str:
            return f"          vnetbench_shape_interfaces: [{name}]\n" if name else ""

        return ("all:\n  vars:\n    ansible_user: root\n"
                f"    ansible_ssh_private_key_file: {self.tmp / 'id_run'}\n"
                "  children:\n    servers:\n      hosts:\n        server-a:\n          ansible_host: 198.18.204.2\n"
                f"{opt_in(shape)}"
                "    clients:\n      hosts:\n        client-1:\n          ansible_host: 198.18.204.6\n"
                f"{opt_in(client_shape)}"
                "    lacking:\n      hosts:\n        client-2:\n          ansible_host: 198.18.204.10\n"
                f"{opt_in(lacking_shape)}"
                + ("    more:\n      hosts:\n" if self.extra else "")
                + "".join(f"        {name}:\n          ansible_host: {srv.address}\n"
                          for name, (srv, _) in self.extra.items()))

    def offloads(self, ns: str) -> dict[str, str]:
        """data0's offloads in `ns`, as ethtool -k names them ("on"/"off")."""
        out = sh("ip", "netns", "exec", ns, "ethtool", "-k", "data0").stdout
        wanted = ("tcp-segmentation-offload", "generic-segmentation-offload", "generic-receive-offload",
                  "tx-checksumming", "rx-checksumming")
        return {k.strip(): v.split()[0] for k, _, v in (line.partition(":") for line in out.splitlines())
                if k.strip() in wanted}

    def steering(self, ns: str | None = None) -> dict[str, list[str]]:
        """What link conditions leave on server-a (or the host of namespace `ns`): IFBs, and qdiscs on its data0
        besides its own noqueue."""
        ns = ns or self.ns_a
        ifbs = sh("ip", "-n", ns, "-o", "link", "show", "type", "ifb").stdout.split("\n")
        qdiscs = sh("tc", "-n", ns, "qdisc", "show", "dev", "data0").stdout.splitlines()
        return {"ifbs": [line.split(":")[1].strip().split("@")[0] for line in ifbs if line.strip()],
                "qdiscs": [q for q in qdiscs if not q.startswith("qdisc noqueue")]}

    def pids(self) -> dict[str, list[str]]:
        """Every process in each host's namespace but its sshd, as 'pid command'."""
        found = {}
        for ns, server in ((self.ns_a, self.a), (self.ns_b, self.b)):
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            found[ns] = [f"{p} {_cmdline(p)}" for p in out if "sshd" not in _cmdline(p)
                         and "unshare" not in _cmdline(p) and _cmdline(p)]
        return found


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
