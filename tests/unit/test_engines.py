"""Container-engine helpers without an engine: the tools image's tar, its digest, the `docker exec` argv, the
exec wrapper run by this machine's busybox, what connect/probe/clean say when no engine answers, and labels."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from vnetbench.errors import EnvironmentProblem
from vnetbench.lab import clean, engines
from vnetbench.lab.engines import EXEC_WRAPPER, LABEL_RUN, Engine, ImagePlan

BUSYBOX = "/bin/busybox"


# ---------------------------------------------------------------- the tools image


@pytest.fixture(scope="module")
def image():
    """The real plan (this machine's busybox and tools) and its tar, rendered once for the module."""
    try:
        plan = engines.plan_image()
    except EnvironmentProblem as e:
        pytest.skip(str(e))
    data = engines.render_image(plan)
    tar = tarfile.open(fileobj=io.BytesIO(data))
    return plan, data, {m.name: m for m in tar.getmembers()}, tar


def test_image_holds_the_wrapper_tmp_and_usr_links(image):
    _plan, _data, members, tar = image
    wrapper = members["bin/vnb-exec"]
    assert wrapper.isreg() and wrapper.mode == 0o755
    assert tar.extractfile(wrapper).read() == EXEC_WRAPPER.encode()
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777
    for link in ("usr/bin", "sbin"):
        assert members[link].issym() and members[link].linkname == "/bin", link
    assert members["root"].isdir() and members["root"].mode == 0o700
    assert tar.extractfile(members["etc/passwd"]).read().startswith(b"root:x:0:0:")


def test_image_holds_busybox_its_applets_tools_and_the_loader(image):
    plan, _data, members, tar = image
    assert members["bin/busybox"].isreg() and members["bin/busybox"].mode == 0o755
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
    assert "sh" in plan.applets and "which" in plan.applets  # the wrapper's shell and its name lookup
    applets = [m for m in members.values() if m.issym() and m.linkname == "busybox"]
    assert len(applets) == len(plan.applets) > 10
    if "iperf3" not in plan.tools:
        pytest.skip("iperf3 is not installed on this machine")
    iperf3 = members["bin/iperf3"]
    assert iperf3.isreg() and iperf3.mode == 0o755
    with open(os.path.realpath(plan.tools["iperf3"]), "rb") as f:
        assert tar.extractfile(iperf3).read() == f.read()
    loaders = [m for name, m in members.items() if name.startswith("lib64/ld-linux")]
    assert loaders and all(m.isreg() and m.size > 0 for m in loaders)
    assert members["lib64"].isdir()  # parents of library paths are made as directories


def test_no_applet_shadows_a_real_tool(image):
    plan, _data, members, tar = image
    names = [m.name for m in tar.getmembers()]
    assert len(names) == len(set(names)), "a path is in the archive twice: the later entry would win"
    assert plan.tools, "no workload tool found on this machine"
    for tool in plan.tools:
        assert tool not in plan.applets, tool
        assert members[f"bin/{tool}"].isreg(), f"bin/{tool} is not the real tool"
    if "ping" not in plan.tools:
        pytest.skip("ping (iputils) is not installed on this machine")
    assert members["bin/ping"].isreg() and not members["bin/ping"].issym()


def test_image_is_reproducible_root_owned_and_timeless(image):
    plan, data, _members, tar = image
    for m in tar.getmembers():
        assert (m.mtime, m.uid, m.gid) == (0, 0, 0), m.name
    assert engines.render_image(plan) == data


# ---------------------------------------------------------------- the image's digest


def small_plan(*files: tuple[str, Path, int]) -> ImagePlan:
    p = ImagePlan()
    for name, path, mode in files:
        p.add(name, str(path), mode)
    return p


def test_digest_follows_content_and_mode(tmp_path):
    import hashlib

    x = tmp_path / "x"
    x.write_bytes(b"first content\n")
    y = tmp_path / "y"
    y.write_bytes(b"another file\n")
    digest, sums = engines.image_digest(small_plan(("bin/x", x, 0o755), ("/lib/y", y, 0o644)))
    assert sums == {"bin/x": hashlib.sha256(b"first content\n").hexdigest(),
                    "lib/y": hashlib.sha256(b"another file\n").hexdigest()}
    assert len(digest) == 20 and int(digest, 16) >= 0
    # the same content (another copy of it, elsewhere) gives the same digest
    x2 = tmp_path / "x2"
    x2.write_bytes(b"first content\n")
    assert engines.image_digest(small_plan(("bin/x", x2, 0o755), ("lib/y", y, 0o644)))[0] == digest
    assert engines.image_digest(small_plan(("bin/x", x, 0o755), ("lib/y", y, 0o644)))[0] == digest
    # a changed mode, a changed content, a changed name: another image
    assert engines.image_digest(small_plan(("bin/x", x, 0o644), ("lib/y", y, 0o644)))[0] != digest
    assert engines.image_digest(small_plan(("bin/z", x, 0o755), ("lib/y", y, 0o644)))[0] != digest
    x.write_bytes(b"first content, changed\n")
    changed, changed_sums = engines.image_digest(small_plan(("bin/x", x, 0o755), ("lib/y", y, 0o644)))
    assert changed != digest
    assert changed_sums["bin/x"] == hashlib.sha256(b"first content, changed\n").hexdigest()
    assert changed_sums["lib/y"] == sums["lib/y"]


def test_digest_follows_the_applets(tmp_path):
    x = tmp_path / "x"
    x.write_bytes(b"x")
    p = small_plan(("bin/x", x, 0o755))
    before = engines.image_digest(p)[0]
    p.applets = ["sh"]
    assert engines.image_digest(p)[0] != before


# ---------------------------------------------------------------- docker exec


def engine(url: str = "unix:///x.sock", kind: str = "docker") -> Engine:
    return Engine(kind=kind, url=url, client=None, info={}, version={})


@pytest.fixture(autouse=True)
def no_engine_of_this_machine(tmp_path, monkeypatch):
    """Neither engine of the machine nor CNI's state on it answers these tests: each sets what it needs."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    monkeypatch.setenv("CONTAINER_HOST", f"unix://{tmp_path}/no-podman.sock")
    monkeypatch.setattr(engines, "CNI_IPAM_STATE", tmp_path / "cni-networks")


def test_exec_argv_runs_the_wrapper_with_interactive_input():
    e = engine()
    assert engines.exec_argv(e, "vnb-abc-c1", ["iperf3", "-c", "10.0.0.2"]) == [
        "docker", "-H", "unix:///x.sock", "exec", "-i", "vnb-abc-c1", "/bin/vnb-exec", "iperf3", "-c", "10.0.0.2"]
    assert engines.exec_argv(e, "vnb-abc-c1", ("ping", "-c", 3, 0.5), cpus="1") == [
        "docker", "-H", "unix:///x.sock", "exec", "-i", "vnb-abc-c1", "/bin/vnb-exec", "-c", "1",
        "ping", "-c", "3", "0.5"]
    assert engines.exec_argv(engine("tcp://10.1.1.1:2375"), "c", iter(["true"]))[:3] == [
        "docker", "-H", "tcp://10.1.1.1:2375"]
    # Podman's own client, as a client of the same API service (not a second, local view of its storage)
    assert engines.exec_argv(engine("unix:///run/p.sock", "podman"), "vnb-abc-r", ["true"], cpus="0") == [
        "podman", "--remote", "--url", "unix:///run/p.sock", "exec", "-i", "vnb-abc-r", "/bin/vnb-exec", "-c", "0",
        "true"]


def test_each_engine_is_found_where_its_own_client_looks(monkeypatch):
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.delenv("CONTAINER_HOST")
    assert engines.engine_url("docker") == "unix:///var/run/docker.sock"
    assert engines.engine_url("podman") == "unix:///run/podman/podman.sock"
    monkeypatch.setenv("DOCKER_HOST", "unix:///d.sock")
    assert engines.engine_url("podman") == "unix:///run/podman/podman.sock"  # DOCKER_HOST is Docker's only
    monkeypatch.setenv("CONTAINER_HOST", "unix:///p.sock")
    assert (engines.engine_url("docker"), engines.engine_url("podman")) == ("unix:///d.sock", "unix:///p.sock")


# ---------------------------------------------------------------- the wrapper, run by this machine's busybox


needs_busybox = pytest.mark.skipif(not os.path.exists(BUSYBOX), reason=f"{BUSYBOX} is missing")


def wrapper_argv(*args: str) -> list[str]:
    return [BUSYBOX, "sh", "-c", EXEC_WRAPPER, "vnb-exec", *args]


def run_wrapper(*args: str) -> subprocess.CompletedProcess:
    """The wrapper with its standard input a pipe held open until it exits, as `docker exec -i` holds it."""
    r, w = os.pipe()
    try:
        return subprocess.run(wrapper_argv(*args), stdin=r, capture_output=True, text=True, timeout=15)
    finally:
        os.close(w)
        os.close(r)


@needs_busybox
def test_wrapper_passes_the_exit_status_through():
    assert run_wrapper("sh", "-c", "exit 7").returncode == 7
    assert run_wrapper("true").returncode == 0


@needs_busybox
def test_wrapper_passes_output_through():
    done = run_wrapper("echo", "hello")
    assert (done.returncode, done.stdout) == (0, "hello\n")
    done = run_wrapper("sh", "-c", 'echo "$1 $2" >&2', "-", "two words", "x")
    assert done.stderr == "two words x\n"


def sleepers() -> set[int]:
    """Pids of live `sleep 300` processes (a zombie's cmdline is empty)."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        args = cmd.split(b"\0")
        if len(args) >= 2 and os.path.basename(args[0]) == b"sleep" and args[1] == b"300":
            out.add(int(d.name))
    return out


@needs_busybox
def test_closing_input_ends_a_long_command():
    before = sleepers()
    ours: set[int] = set()
    proc = subprocess.Popen(wrapper_argv("sleep", "300"), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 5
        while not ours and time.monotonic() < deadline:
            time.sleep(0.05)
            ours = sleepers() - before
        assert ours, "the wrapper did not start sleep 300"
        time.sleep(0.3)
        assert proc.poll() is None, "the wrapper ended while its input was open"
        proc.stdin.close()
        deadline = time.monotonic() + 5
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is not None, "the wrapper outlived its input by 5 s"
        assert proc.returncode == 128 + 15  # the tool's own status: ended by SIGTERM
        deadline = time.monotonic() + 5
        while ours & sleepers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not ours & sleepers(), "sleep 300 survived its wrapper"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in ours & sleepers():
            os.kill(pid, 9)


@needs_busybox
def test_an_unknown_command_is_said_with_127():
    done = run_wrapper("vnb-no-such-command-here", "--x")
    assert done.returncode == 127
    assert "vnb-no-such-command-here: command not found in the container" in done.stderr


@needs_busybox
def test_cpus_pin_the_command():
    if 0 not in os.sched_getaffinity(0) or not os.path.exists("/bin/taskset"):
        pytest.skip("cpu 0 is not ours, or /bin/taskset is missing")
    done = run_wrapper("-c", "0", "cat", "/proc/self/status")
    assert done.returncode == 0, done.stderr
    assert "Cpus_allowed_list:\t0\n" in done.stdout


# ---------------------------------------------------------------- no engine


def test_connect_without_a_socket_says_how_to_start_one(tmp_path, monkeypatch):
    url = f"unix://{tmp_path}/none.sock"
    monkeypatch.setenv("DOCKER_HOST", url)
    with pytest.raises(EnvironmentProblem) as why:
        engines.connect()
    msg = str(why.value)
    assert "no engine listens" in msg and url in msg and "apt-get install docker.io" in msg
    assert f"dockerd -H {url}" in msg  # not the default address: the hint says which


def test_podman_without_its_service_says_how_to_start_it(tmp_path, monkeypatch):
    url = f"unix://{tmp_path}/podman.sock"
    monkeypatch.setenv("CONTAINER_HOST", url)
    with pytest.raises(EnvironmentProblem) as why:
        engines.connect("podman")
    msg = str(why.value)
    assert msg.startswith(f"podman: no engine listens at {url} -> ")
    assert "apt-get install podman catatonit" in msg and "systemctl start podman.socket" in msg
    assert f"podman system service --time=0 {url} &" in msg and "CONTAINER_HOST" in msg


def test_an_engine_without_its_command_line_client_is_not_usable(tmp_path, monkeypatch):
    (tmp_path / "podman.sock").write_text("")
    monkeypatch.setenv("CONTAINER_HOST", f"unix://{tmp_path}/podman.sock")
    monkeypatch.setenv("PATH", str(tmp_path))  # no podman program anywhere
    with pytest.raises(EnvironmentProblem, match="its command-line client `podman` is not installed"):
        engines.connect("podman")


def test_probe_says_why_and_is_cached_per_address(tmp_path, monkeypatch):
    first = f"unix://{tmp_path}/none.sock"
    monkeypatch.setenv("DOCKER_HOST", first)
    found, msg = engines.probe("docker")
    assert found is None and "no engine listens" in msg and first in msg
    # cached: a socket file appearing later does not change the answer for this address
    (tmp_path / "none.sock").write_text("")
    assert engines.probe("docker") == (None, msg)
    second = f"unix://{tmp_path}/other.sock"
    monkeypatch.setenv("DOCKER_HOST", second)
    found, msg2 = engines.probe("docker")
    assert found is None and second in msg2 and first not in msg2


@pytest.fixture
def mute_socket(tmp_path, monkeypatch):
    """A unix socket that accepts and hangs up at once: something listens, but no engine."""
    monkeypatch.setattr(engines, "API_TIMEOUT_S", 2)
    path = tmp_path / "mute.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)
    server.settimeout(0.1)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    url = f"unix://{path}"
    monkeypatch.setenv("DOCKER_HOST", url)
    yield url
    stop.set()
    t.join(2)
    server.close()


def test_connect_to_something_else_says_it_does_not_answer(mute_socket):
    started = time.monotonic()
    with pytest.raises(EnvironmentProblem) as why:
        engines.connect()
    assert time.monotonic() - started < 10
    msg = str(why.value)
    assert f"docker at {mute_socket} does not answer" in msg and "apt-get install docker.io" in msg


def test_clean_reports_an_engine_that_does_not_answer(mute_socket):
    found, errors = clean.engine_leftovers()
    assert found == []
    assert len(errors) == 1 and mute_socket in errors[0] and "does not answer" in errors[0]


def test_clean_skips_an_engine_that_is_not_there(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    assert clean.engine_leftovers() == ([], [])


def test_clean_removes_cni_state_of_runs_that_are_gone_and_only_theirs(tmp_path):
    state = engines.CNI_IPAM_STATE
    for name in ("vnb-aaa111-b1", "vnb-aaa111-b12", "vnb-bbb222-b1", "users-net", "podman"):
        (state / name).mkdir(parents=True)
        (state / name / "last_reserved_ip.0").write_text("198.19.1.3")
    assert [p.name for p in engines.cni_state("vnb-", skip=("vnb-bbb222-",))] == ["vnb-aaa111-b1", "vnb-aaa111-b12"]
    found, errors = clean.engine_leftovers("vnb-aaa111-", remove=False)
    assert found == [f"CNI address state {state / 'vnb-aaa111-b1'}", f"CNI address state {state / 'vnb-aaa111-b12'}"]
    assert errors == [] and (state / "vnb-aaa111-b1").exists()  # a check removes nothing
    clean.engine_leftovers("vnb-", skip=("vnb-bbb222-",), remove=True)  # bbb222 is live
    assert sorted(p.name for p in state.iterdir()) == ["podman", "users-net", "vnb-bbb222-b1"]
    engines.forget_cni_state("vnb-bbb222-b1")  # one network's own, by its exact name
    engines.forget_cni_state("vnb-bbb222-b1")  # already gone: fine
    assert sorted(p.name for p in state.iterdir()) == ["podman", "users-net"]


def test_clean_without_cni_state_on_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "CNI_IPAM_STATE", tmp_path / "nowhere")
    assert engines.cni_state("vnb-") == [] and clean.engine_leftovers() == ([], [])


# ---------------------------------------------------------------- what the engine is asked and answers


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_process_limits_are_cut_by_column():
    # Recorded from a Podman API service on this project's machine: Podman lowered its own process limit to
    # 32768, under the shell's 96365, and a container asking for more could not start.
    limits = engines.parse_limits((FIXTURES / "proc_limits_podman_service.txt").read_text())
    assert limits["Max open files"] == 20000 and limits["Max processes"] == 32768
    assert "Max cpu time" not in limits  # unlimited: nothing to pass on
    assert limits["Max locked memory"] == 8388608 and limits["Max pending signals"] == 96365
    assert engines.process_limits(os.getpid())["Max open files"] == __import__("resource").getrlimit(
        __import__("resource").RLIMIT_NOFILE)[1]


def test_podman_containers_get_the_engines_own_limits(monkeypatch):
    import resource

    pod, dock = engine(kind="podman"), engine()
    monkeypatch.setattr(Engine, "daemon_pid", lambda self: os.getpid())
    ulimits = {u.name: (u.soft, u.hard) for u in pod.ulimits()}
    nofile, nproc = resource.getrlimit(resource.RLIMIT_NOFILE)[1], resource.getrlimit(resource.RLIMIT_NPROC)[1]
    assert ulimits == {k: (v, v) for k, v in (("nofile", nofile), ("nproc", nproc))
                       if v != resource.RLIM_INFINITY}
    assert dock.ulimits() == []  # Docker's containers inherit dockerd's
    assert pod.userland_proxy() is False  # rootful Podman publishes ports with NAT rules only


@pytest.mark.parametrize("answer, expected", [
    # Docker 20.10 and Podman 4.3, recorded: one JSON line each
    ('{"status":"sha256:03e55b5b0b0a"}\r\n', "sha256:03e55b5b0b0a"),
    ('{"status":"sha256:03e5","progress":"","progressDetail":{},"id":"sha256:03e5"}\n', "sha256:03e5"),
    ('{"status":"Loading layer"}\n{"status":"sha256:abc"}\n', "sha256:abc"),
])
def test_an_imported_image_is_found_by_the_id_the_engine_answers(answer, expected):
    assert engines.imported_id(answer) == expected


@pytest.mark.parametrize("answer, needle", [
    ('{"error":"no space left on device"}\n', "no space left on device"),
    ('{"status":"done"}\n', "no image id"),
    ("", "no image id"),
])
def test_an_import_without_an_id_is_an_error(answer, needle):
    with pytest.raises(ValueError, match=needle):
        engines.imported_id(answer)


# ---------------------------------------------------------------- labels


def test_labelled_matches_run_prefixes():
    net = SimpleNamespace(attrs={"Labels": {LABEL_RUN: "vnb-abc123"}})
    container = SimpleNamespace(attrs={"Config": {"Labels": {LABEL_RUN: "vnb-abc123", "other": "x"}}})
    for obj in (net, container):
        assert engines.labelled(obj, "vnb-")
        assert engines.labelled(obj, "vnb-abc123-")
        assert engines.labelled(obj, "vnb-zzz-", "vnb-abc123-")  # any of several
        assert not engines.labelled(obj, "vnb-abc12-x")
        assert not engines.labelled(obj, "vnb-abd")
        assert not engines.labelled(obj, "vnb-abc1234-")
        assert not engines.labelled(obj)
    for attrs in ({}, {"Labels": None}, {"Labels": {"other": "vnb-abc123"}}, {"Config": {"Labels": None}},
                  {"Config": None}):
        assert not engines.labelled(SimpleNamespace(attrs=attrs), "vnb-"), attrs


def test_the_userland_proxy_setting_is_read_as_dockerd_reads_it():
    from vnetbench.lab.engines import userland_proxy_setting

    files = {"/etc/docker/daemon.json": '{"userland-proxy": false}', "/srv/d.json": '{"debug": true}'}
    read = files.get
    assert userland_proxy_setting(["dockerd"], lambda p: None) is True  # Docker's default
    assert userland_proxy_setting(["dockerd"], read) is False  # the default configuration file says so
    assert userland_proxy_setting(["dockerd", "--userland-proxy=false"], lambda p: None) is False
    assert userland_proxy_setting(["dockerd", "--userland-proxy=true"], read) is True  # the flag wins
    assert userland_proxy_setting(["dockerd", "--userland-proxy"], read) is True
    assert userland_proxy_setting(["dockerd", "--config-file", "/srv/d.json"], read) is True
    assert userland_proxy_setting(["dockerd", "--config-file=/srv/d.json"], read) is True
    assert userland_proxy_setting(["dockerd"], lambda p: "{not json") is None  # unreadable: unknown, not guessed
