"""The hosts' run lock script (hosts/lock.py), run here with sh as a host's login shell would: one holder at
a time per network namespace, the others told who holds it, nothing of the holder's left when it ends, and
nothing another user of the host could plant at its names followed, opened or trusted.

Each script runs in a network namespace of its own and a mount namespace with a /run of its own (a tmpfs), so
this machine's own /run is never touched; `setup` is a shell line run there first, with $n the inode of the
namespace's network stack (what the lock file is named after).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vnetbench.hosts.lock import BUSY, LOCK_SCRIPT, REFUSED, Answer, read_answer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes network and mount namespaces (root)")

USER = 64243  # a user of no one's: the host's unprivileged user, or a non-root login


def start(setup: str, who: str, *, user: int | None = None, env: str = "") -> subprocess.Popen:
    """The lock script in namespaces of its own, after `setup`, as root or `user` (with `env`: NAME=VALUE...)."""
    become = (f"exec setpriv --reuid {user} --regid {user} --clear-groups env -i PATH=\"$PATH\" {env} "
              if user is not None else "exec ")
    script = ('mount -t tmpfs -o mode=0755 vnb-test-run /run || exit 9; n=$(readlink /proc/self/ns/net | '
              f'tr -cd 0-9); {setup}\n{become}sh -c "$0" vnetbench-lock "$1"')
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--net", "sh", "-c", script,
                             LOCK_SCRIPT, who], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def let_go(proc: subprocess.Popen) -> None:
    """What the hosts' wrapper does when the run's session goes: TERM to the holder and what it started."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        stream.close()


def in_namespaces_of(proc: subprocess.Popen, command: str) -> subprocess.CompletedProcess:
    """`command` (sh) in the holder's network and mount namespaces: its /run, its lock."""
    return subprocess.run(["nsenter", f"--net=/proc/{proc.pid}/ns/net", f"--mount=/proc/{proc.pid}/ns/mnt",
                           "sh", "-c", command, LOCK_SCRIPT], capture_output=True, text=True, timeout=10)


def test_one_holder_per_network_namespace_and_the_others_told_who():
    holder = start("", "run A (scenario 'x')")
    try:
        first = read_answer(holder, 10)
        assert first.held and first.stdout.startswith("locked /run/vnetbench-hosts/net"), first
        lock_file = first.stdout.split(" ", 1)[1]
        owner = f"{lock_file}.owner"
        state = in_namespaces_of(holder, f'stat -c "%F %u %a" /run/vnetbench-hosts {lock_file} {owner}; cat {owner}')
        assert state.stdout.splitlines() == ["directory 0 700", "regular empty file 0 600", "regular file 0 600",
                                             "run A (scenario 'x')"], state
        busy = in_namespaces_of(holder, 'exec sh -c "$0" vnetbench-lock "run B"')
        assert busy.returncode == BUSY and busy.stdout.splitlines() == ["busy", "run A (scenario 'x')"]
        # Another network namespace of the same machine (and /run) is another host (held for 1 s: timeout says 124)
        other = in_namespaces_of(holder, 'exec timeout 1 unshare --net sh -c "$0" vnetbench-lock "run C"')
        assert other.returncode == 124 and other.stdout.startswith("locked /run/vnetbench-hosts/net"), other
        assert other.stdout.split()[1] != lock_file
    finally:
        let_go(holder)
    assert holder.returncode == 0


@pytest.mark.parametrize("planted", ["link at the owner file", "FIFO at the lock file"])
def test_nothing_planted_in_the_world_writable_lock_directory_is_followed_or_opened(tmp_path, planted):
    """The lock once lived in /run/lock, where any user of the host could plant a link that root then wrote
    through, or a FIFO that hung every run: whatever is there now, the lock is taken elsewhere, at once."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    old = "/run/lock/vnetbench-net$n.lock"
    # The link is root's own here: with fs.protected_symlinks the kernel would not follow another user's in a
    # sticky directory, a protection the lock must not depend on (it is a sysctl, and off on some hosts).
    plant = (f"ln -s {victim} {old}.owner-0" if planted.startswith("link") else f"mkfifo {old} && chown {USER} {old}")
    holder = start(f"mkdir -m 1777 /run/lock && {plant}", "run A")
    try:
        began = time.monotonic()
        answer = read_answer(holder, 10)
        took = time.monotonic() - began
    finally:
        let_go(holder)
    assert victim.read_text() == "precious\n"
    assert answer.held and answer.stdout.startswith("locked /run/vnetbench-hosts/") and took < 5, (answer, took)


# (what is planted in the lock's own directory, or made of it; what the refusal says)
REFUSALS = {
    "the directory a link": ("mkdir -m 0700 /run/elsewhere && ln -s /run/elsewhere /run/vnetbench-hosts",
                             "/run/vnetbench-hosts is not a directory (a link or a file is there); remove it"),
    "the directory open to others": ("mkdir -m 0755 /run/vnetbench-hosts",
                                     "/run/vnetbench-hosts belongs to uid 0 with mode 755, not to uid 0 with mode 700"),
    "the directory another user's": (f"mkdir -m 0700 /run/vnetbench-hosts && chown {USER} /run/vnetbench-hosts",
                                     f"/run/vnetbench-hosts belongs to uid {USER} with mode 700, not to uid 0"),
    "a FIFO at the lock file": ("mkdir -m 0700 /run/vnetbench-hosts && mkfifo /run/vnetbench-hosts/net$n.lock",
                                "/run/vnetbench-hosts/net{n}.lock is not a regular file; remove it"),
    "a link at the lock file": ("mkdir -m 0700 /run/vnetbench-hosts && ln -s /etc/passwd /run/vnetbench-hosts/net$n.lock",
                                "/run/vnetbench-hosts/net{n}.lock is not a regular file; remove it"),
    "/run open to others": ("chmod 0777 /run", "/run is writable by others (mode 777)"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_lock_directory_or_file_that_is_not_the_users_own_is_refused_naming_it(case):
    setup, said = REFUSALS[case]
    proc = start(setup, "run A")
    try:
        began = time.monotonic()
        answer = read_answer(proc, 10)
        took = time.monotonic() - began
    finally:
        let_go(proc)
    assert not answer.held and proc.returncode == REFUSED and took < 5, (answer, proc.returncode, took)
    lines = answer.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vnetbench-lock: "), answer
    assert all(part in lines[0] for part in said.split("{n}")), (lines[0], said)  # {n}: the namespace's inode


def test_a_link_at_the_owner_file_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    holder = start(f"mkdir -m 0700 /run/vnetbench-hosts && ln -s {victim} /run/vnetbench-hosts/net$n.lock.owner", "run A")
    try:
        answer = read_answer(holder, 10)
        assert answer.held, answer
        owner = in_namespaces_of(holder, 'f=$(ls /run/vnetbench-hosts/*.owner); stat -c "%F" "$f"; cat "$f"')
        assert owner.stdout.splitlines() == ["regular file", "run A"], owner
    finally:
        let_go(holder)
    assert victim.read_text() == "precious\n"


def test_a_user_other_than_root_keeps_its_lock_in_a_directory_of_its_own():
    home = "/run/home-user"
    holder = start(f"mkdir -m 0755 {home} && chown {USER}:{USER} {home}", "run U", user=USER, env=f"HOME={home}")
    try:
        answer = read_answer(holder, 10)
        host = subprocess.run(["uname", "-n"], capture_output=True, text=True).stdout.strip()
        d = f"{home}/.cache/vnetbench-hosts-{host}"
        assert answer.held and answer.stdout.startswith(f"locked {d}/net"), answer
        state = in_namespaces_of(holder, f'stat -c "%F %u %a" {home}/.cache {d}')
        assert state.stdout.splitlines() == [f"directory {USER} 700", f"directory {USER} 700"], state
    finally:
        let_go(holder)
    # With XDG_RUNTIME_DIR (a login session's, made by pam_systemd), there; a link there is not followed
    runtime = "/run/user-runtime"
    mine = start(f"mkdir -m 0700 {runtime} && chown {USER} {runtime}", "run U", user=USER,
                 env=f"HOME=/nonexistent XDG_RUNTIME_DIR={runtime}")
    linked = start(f"mkdir -m 0700 {runtime} /run/x && chown {USER} {runtime} /run/x && "
                   f"ln -s /run/x {runtime}/vnetbench-hosts && chown -h {USER} {runtime}/vnetbench-hosts", "run U", user=USER,
                   env=f"HOME=/nonexistent XDG_RUNTIME_DIR={runtime}")
    try:
        answer, refused = read_answer(mine, 10), read_answer(linked, 10)
    finally:
        let_go(mine)
        let_go(linked)
    assert answer.held and answer.stdout.startswith(f"locked {runtime}/vnetbench-hosts/net"), answer
    assert not refused.held and f"{runtime}/vnetbench-hosts is not a directory" in refused.stderr, refused


def test_an_answer_that_does_not_come_or_does_not_end_is_stopped_within_its_bounds():
    """The controller's side: a host that never answers (a FIFO opened by an older vnetbench, a hung host) or
    answers without end is stopped, not waited for."""
    silent = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    began = time.monotonic()
    answer = read_answer(silent, 1.0)
    assert time.monotonic() - began < 3 and silent.returncode is not None
    assert answer == Answer(False, "", "", "it did not answer within 1 s")
    endless = subprocess.Popen(["yes", "busy"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    answer = read_answer(endless, 10, limit=100_000)
    assert endless.returncode is not None and answer.stopped.startswith("it answered more than the lock answer limit")
    assert len(answer.stdout) == 100_000
    for proc in (silent, endless):
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
