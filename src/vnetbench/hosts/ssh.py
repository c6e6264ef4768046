"""One SSH connection per host, through the OpenSSH client with connection multiplexing: the command channel
of real hosts (``run --hosts``) and, without multiplexing (see below), of the lab's QEMU guests.

Why OpenSSH's own client rather than asyncssh: it honours the user's ``~/.ssh/config`` (ProxyJump,
Host aliases, IdentityFile, ciphers), their agent and their ``known_hosts`` exactly as their own
``ssh`` does, with nothing re-implemented or re-configured, so "it works with ssh" means it works here.
Multiplexing (ControlMaster=auto, ControlPersist) keeps one authenticated TCP connection per host and
runs each command as a new channel on it, so a command costs a round trip, not a handshake.

::

    controller                                   host
    ssh -o ControlPath=DIR/%C ... -- 'argv'  ─┐
    ssh -o ControlPath=DIR/%C ... -- 'argv'  ─┼─ DIR/%C ── master ssh ══ one TCP ══> sshd ─> $SHELL -c 'argv'
    ssh -O exit  (close)                     ─┘

Commands are argument lists. The remote side runs a command line through the login shell, so the list is
quoted here, in one place, with :func:`shlex.join`: every element arrives as one literal argument, and a
host name, label or option value can never run a command. (This assumes a POSIX login shell on the host,
as Ansible's ``sh`` shell plugin does; csh and fish quote differently.)

Host keys are always checked: StrictHostKeyChecking=yes by default, ``accept-new`` only when asked
(trust on first use, and a changed key is still refused), never ``no``. Keepalives end the connection, and
every command on it, when the host has not answered for 30 s (a host that lost power sends no reset).

A guest is reached from the network namespace its QEMU runs in: ``via`` (``ip netns exec NS``) is put in
front of every ssh command. Its dropbear is not multiplexed on (``multiplex=False``: a connection per
command): with several channels on one connection, dropbear 2022.83 once in about fifteen runs of the guest
tests closed a new channel without running its command (no output, no exit status, right after another
channel of the connection closed), and ssh exited 255.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from vnetbench.errors import HostError
from vnetbench.hosts.inventory import Inventory, InventoryHost
from vnetbench.lab.nodes import OutputTooLarge, RunsCommands, bounded_run
from vnetbench.limits import REMOTE_OUTPUT_BYTES

SSH_FAILED = 255  # ssh's own exit status when it, not the remote command, failed
CONTROL_PERSIST_S = 60  # an idle master outlives a crashed controller by at most this long
# sshd gives non-root users a short PATH (often /usr/bin:/bin); tools in sbin (ip, tc) are still the host's.
SBIN_PATH = 'PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"; export PATH; '
SUDO = ("sudo", "-n", "--")  # -n: fail at once instead of prompting for a password nobody will type
CONTROL_DIR_PREFIX = "vnb-ssh-"  # + the owner's pid, in the temp dir; `vnetbench clean` removes a dead owner's
KEEPALIVE_S, KEEPALIVE_COUNT = 10, 3  # a host silent for 30 s is gone


class HostKeyUnknown(HostError):
    pass


class HostKeyChanged(HostError):
    pass


class AuthenticationRefused(HostError):
    pass


class Unreachable(HostError):
    pass


class CommandTimedOut(HostError):
    pass


@dataclass
class Privileges:
    user: str  # the remote user, as the host says (`id -un`)
    root: bool  # the user is root
    sudo: bool  # `sudo -n` works without a password
    detail: str = ""  # why sudo does not (its message)

    @property
    def ok(self) -> bool:
        return self.root or self.sudo


class SshConnection(RunsCommands):
    """Commands on one inventory host over a multiplexed OpenSSH connection. Use as a context manager,
    or call :meth:`close`: it stops the master connection and removes its private socket directory."""

    def __init__(self, host: InventoryHost, *, accept_new_host_keys: bool = False, connect_timeout: float = 10,
                 known_hosts_file: str | Path | None = None, config_file: str | Path | None = None,
                 ssh: str = "ssh", via: Sequence[str] = (), multiplex: bool = True):
        self.host = host
        self.multiplex = multiplex
        self.via = [str(a) for a in via]  # the local argv ssh runs under (a guest's: ip netns exec NS)
        self.accept_new_host_keys = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self.known_hosts_file = str(known_hosts_file) if known_hosts_file else None
        self.config_file = str(config_file) if config_file else None
        self.ssh = ssh
        # mkdtemp makes it 0700: nobody else can reach (or plant) the control socket. %C (a hash of the
        # local host, remote host, port and user) keeps socket paths short whatever the host name is.
        # Named with this process's id, so `vnetbench clean` can tell the directory (and its master) of a
        # vnetbench that was killed from one in use.
        # None without multiplexing: there is no master and no socket.
        self.control_dir = Path(tempfile.mkdtemp(prefix=f"{CONTROL_DIR_PREFIX}{os.getpid()}-")) if multiplex \
            else None
        self._privileges: Privileges | None = None

    # ------------------------------------------------------------------ the ssh command line

    def options(self) -> list[str]:
        opts = ["-o", "BatchMode=yes",
                "-o", f"StrictHostKeyChecking={'accept-new' if self.accept_new_host_keys else 'yes'}",
                "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
                *(["-o", "ControlMaster=auto",
                   "-o", f"ControlPath={self.control_dir}/%C",
                   "-o", f"ControlPersist={CONTROL_PERSIST_S}"] if self.multiplex else
                  ["-o", "ControlMaster=no", "-o", "ControlPath=none"]),
                "-o", f"ServerAliveInterval={KEEPALIVE_S}",
                "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}",
                # The remote command's stderr is the caller's; ssh's own chatter ("Permanently added ...")
                # is not. Errors (ERROR and above) still reach stderr, where _failure reads them.
                "-o", "LogLevel=ERROR",
                # Whatever the user's ssh config says for other uses: a benchmark host gets no way back to the
                # controller's agent, X display or ports (root there could use them as the user)
                "-o", "ForwardAgent=no", "-o", "ForwardX11=no", "-o", "ClearAllForwardings=yes"]
        if self.config_file:
            opts = ["-F", self.config_file, *opts]
        if self.known_hosts_file:
            opts += ["-o", f"UserKnownHostsFile={self.known_hosts_file}", "-o", "GlobalKnownHostsFile=/dev/null"]
        if self.host.user:
            opts += ["-l", self.host.user]
        if self.host.port:
            opts += ["-p", str(self.host.port)]
        if self.host.private_key_file:
            opts += ["-i", self.host.private_key_file]
        return opts

    def command(self, argv: Sequence[str], pin: bool = False, root: bool = False) -> list[str]:
        """The local argv that runs ``argv`` on the host (through ``sudo -n`` when ``root`` and the user is not)."""
        if not argv:
            raise ValueError("an empty command")
        argv = [str(a) for a in argv]
        if root and not self.privileges().root:
            argv = [*SUDO, *argv]
        # "--" ends ssh's options: an address starting with "-" cannot become one.
        return [*self.via, self.ssh, *self.options(), "-T", "--", self.host.address, remote_command(argv)]

    # ------------------------------------------------------------------ running

    def run(self, argv: Sequence[str], timeout: float = 30.0, pin: bool = False,
            root: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` on the host and wait: its exit status, stdout and stderr come back as they were.
        Raises a :class:`HostError` when ssh itself failed (host key, authentication, network)."""
        local = self.command(argv, root=root)
        try:
            done = bounded_run(local, timeout, REMOTE_OUTPUT_BYTES.value)
        except subprocess.TimeoutExpired:
            raise CommandTimedOut(f"{self.where()}: `{shlex.join(argv)}` did not finish within {timeout:g} s",
                                  "check the host's load, or that the address answers ssh at all") from None
        except OutputTooLarge:
            raise HostError(f"{self.where()}: `{shlex.join(argv)[:200]}` answered more than {REMOTE_OUTPUT_BYTES}; "
                            "it was stopped and nothing of its answer used",
                            "check what the host runs under that name (its answers are kilobytes)") from None
        if done.returncode == SSH_FAILED:
            failure = self.failure(done.stderr)
            if failure is not None:
                raise failure
        return done

    def connect(self) -> None:
        """Open the master connection (or fail with the reason): reachable, host key known, authenticated."""
        self.run(["true"], timeout=self.connect_timeout + 10)

    def privileges(self) -> Privileges:
        """Whether commands that need root can run: the user is root, or sudo works without a password."""
        if self._privileges is None:
            who = self.run(["id", "-un"]).stdout.strip()
            uid = self.run(["id", "-u"]).stdout.strip()
            if uid == "0":
                self._privileges = Privileges(who, root=True, sudo=False)
            else:
                probe = self.run([*SUDO, "true"])
                detail = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
                self._privileges = Privileges(who, root=False, sudo=probe.returncode == 0,
                                              detail="" if probe.returncode == 0 else detail)
        return self._privileges

    @property
    def name(self) -> str:
        """The host's name in the inventory: what link conditions' messages and records call it."""
        return self.host.name

    def where(self) -> str:
        port = f" port {self.host.port}" if self.host.port else ""
        user = f"{self.host.user}@" if self.host.user else ""
        return f"host {self.host.name} ({user}{self.host.address}{port})"

    # ------------------------------------------------------------------ ssh's failures, for people

    def failure(self, stderr: str) -> HostError | None:
        """The error an ssh exit status 255 stands for, from ssh's stderr; None when it is not ssh's
        (the remote command itself exited 255)."""
        text = stderr.replace("\r", "")
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
        target = self.ssh_target()
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "Host key for" in text and "has changed" in text:
            offending = re.search(r"Offending \S+ key in (\S+):(\d+)", text)
            where = f"{offending.group(1)} line {offending.group(2)}" if offending else self.known_hosts()
            return HostKeyChanged(
                f"{self.where()}: its host key has CHANGED from the one in {where}; this is what a "
                f"man-in-the-middle looks like",
                f"if the host was reinstalled, check the new key's fingerprint with its owner, then "
                f"`{shlex.join(['ssh-keygen', '-f', self.known_hosts(), '-R', target])}` and connect again")
        if "Host key verification failed" in text or "No " in text and "host key is known" in text:
            return HostKeyUnknown(
                f"{self.where()}: its host key is not in {self.known_hosts()} (StrictHostKeyChecking=yes)",
                f"check the fingerprint out of band and add it (`{shlex.join(['ssh-keyscan', *self._port_args(), self.host.address])} "
                f">> {shlex.quote(self.known_hosts())}`), or run with --accept-new-host-keys "
                f"(trusts the key seen first)")
        if "Permission denied" in text or "Too many authentication failures" in text:
            key = self.host.private_key_file
            return AuthenticationRefused(
                f"{self.where()}: authentication refused ({last})",
                f"install a key for the user: `{shlex.join(['ssh-copy-id', *(['-i', key] if key else []), *self._port_args(), self._user_at() + self.host.address])}`, "
                f"or load it into the agent (ssh-add), or set ansible_user / ansible_ssh_private_key_file in the "
                f"inventory")
        for pattern, what in ((r"Connection timed out|Operation timed out|timed out", "timed out"),
                              (r"Connection refused", "connection refused"),
                              (r"No route to host", "no route to host"),
                              (r"Network is unreachable", "network unreachable"),
                              (r"Could not resolve hostname", "name not resolved"),
                              (r"Connection closed by|Connection reset by|kex_exchange_identification",
                               "connection closed before login")):
            if re.search(pattern, text):
                return Unreachable(
                    f"{self.where()}: unreachable, {what} ({last})",
                    f"check that {self.host.address}{self._port_words()} is the host's address, that sshd "
                    f"runs there and that no firewall drops it "
                    f"(`{shlex.join(['ssh', '-v', *self._port_args(), self._user_at() + self.host.address])}` shows "
                    "where it stops)")
        if text.strip().startswith("ssh:") or "ssh_exchange" in text or "mux_client" in text:
            return HostError(f"{self.where()}: ssh failed: {last}", "`ssh -v` to the host shows why")
        return None

    def known_hosts(self) -> str:
        """The known_hosts file ssh checks for this host (the user's ssh config decides, as ssh -G says)."""
        if self.known_hosts_file:
            return self.known_hosts_file
        try:
            out = subprocess.run([self.ssh, *self.options(), "-G", "--", self.host.address], capture_output=True,
                                 text=True, timeout=5, stdin=subprocess.DEVNULL).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        for line in out.splitlines():
            if line.startswith("userknownhostsfile "):
                return line.split()[1]
        return "~/.ssh/known_hosts"

    def ssh_target(self) -> str:
        """How known_hosts names this host: [address]:port for a port other than 22."""
        return f"[{self.host.address}]:{self.host.port}" if self.host.port and self.host.port != 22 \
            else self.host.address

    def _user_at(self) -> str:
        return f"{self.host.user}@" if self.host.user else ""

    def _port_args(self) -> list[str]:
        return ["-p", str(self.host.port)] if self.host.port else []

    def _port_words(self) -> str:
        return f" port {self.host.port}" if self.host.port else ""

    # ------------------------------------------------------------------ closing

    def master_running(self) -> bool:
        check = subprocess.run([self.ssh, *self.options(), "-O", "check", "--", self.host.address],
                               capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        return check.returncode == 0

    def close(self) -> None:
        if self.control_dir is not None and self.control_dir.exists():
            if any(self.control_dir.iterdir()):
                try:
                    subprocess.run([self.ssh, *self.options(), "-O", "exit", "--", self.host.address],
                                   capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
                except (OSError, subprocess.TimeoutExpired):
                    pass  # the master then ends by itself after ControlPersist; its socket goes with the dir
            shutil.rmtree(self.control_dir, ignore_errors=True)

    def __enter__(self) -> "SshConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def with_sbin(argv: Sequence[str]) -> list[str]:
    """`argv` run with sbin on its PATH (for ip and tc, whatever PATH the host's sshd gives)."""
    return ["sh", "-c", SBIN_PATH + 'exec "$@"', "sh", *argv]


def remote_command(argv: Sequence[str]) -> str:
    """The one string sshd hands to the login shell: each element quoted, so each arrives as one literal
    argument whatever characters it holds."""
    return shlex.join([str(a) for a in argv])


@dataclass(frozen=True)
class HostAccess:
    """How to reach the inventory's hosts: the same options as `doctor --hosts`."""

    inventory: Inventory
    accept_new_host_keys: bool = False
    ssh_config: str | None = None
    connect_timeout: float = 10

    def connect(self, host: InventoryHost) -> SshConnection:
        return SshConnection(host, accept_new_host_keys=self.accept_new_host_keys, config_file=self.ssh_config,
                             connect_timeout=self.connect_timeout)
