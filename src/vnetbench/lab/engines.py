"""Container engines (Docker, Podman) as vnetbench uses them: a connection, the tools image, and cleanup by label.

Lifecycle (networks, containers, images) goes through the engine's Docker-compatible API with the Docker SDK
for Python (Podman serves the same API: `podman system service`, or systemd's podman.socket); workload processes
are started with the engine's own command-line client (`docker exec`, `podman --remote exec`: :func:`exec_argv`),
a process whose output goes to files like every other tool's and whose death ends the command inside the container.

Everything vnetbench makes in an engine carries the label ``org.vnetbench.run`` (the run's prefix,
``vnb-<id>``); `vnetbench clean` removes what carries a prefix of a run that is not live, and never
looks at anything without the label: a user's own containers, networks and images are not ours.

The tools image is built from this machine's own files (no registry): busybox-static and its applets,
every workload tool with the shared libraries it loads (the same selection as a VM guest's initramfs,
:mod:`vnetbench.lab.guest.initramfs`), imported as ``vnetbench-tools:<digest of its content>``, so it is
built once and reused until a package changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import struct
import tarfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlparse

from vnetbench import tools
from vnetbench.errors import EnvironmentProblem, LabError
from vnetbench.lab.nodes import exec_wrapper

LABEL_RUN = "org.vnetbench.run"  # the run prefix (vnb-<id>) of what a run made
LABEL_IMAGE = "org.vnetbench.image"  # on the tools image: its content digest
IMAGE_REPOSITORY = "vnetbench-tools"
IMAGE_FORMAT = "1"  # bump when the image's layout (not its inputs) changes
DEFAULT_URLS = {"docker": "unix:///var/run/docker.sock", "podman": "unix:///run/podman/podman.sock"}
URL_VARIABLES = {"docker": "DOCKER_HOST", "podman": "CONTAINER_HOST"}  # as each engine's own client reads them
API_TIMEOUT_S = 60

# What every workload command runs through inside a container (/bin/vnb-exec in the tools image, busybox
# sh). `docker exec` does not stop the command it started when its client goes (moby issue 9098): killed,
# the client only disconnects. nodes.exec_wrapper says how the wrapper ends it. Program names are resolved
# to paths first: busybox's shell would otherwise run its own applet of the same name (its ping, not
# iputils'), as in a VM guest's wrapper.
EXEC_WRAPPER = exec_wrapper("/bin/", "in the container")


@dataclass
class Engine:
    """A reachable engine: its API client, what it says about itself, and where its daemon's network lives."""

    kind: str
    url: str
    client: Any  # docker.DockerClient
    info: dict[str, Any]
    version: dict[str, Any]

    @property
    def cli(self) -> list[str]:
        """The engine's command-line client aimed at this engine."""
        return client_argv(self.kind, self.url)

    def daemon_pid(self) -> int:
        """The daemon's process id, from the credentials of its socket (SO_PEERCRED)."""
        path = socket_path(self.url)
        if path is None:
            raise LabError(f"{self.kind} at {self.url}: only a local engine (a unix socket) can be measured")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[0]

    def userland_proxy(self) -> bool | None:
        """Whether the daemon carries published ports through a userland proxy; None when it cannot be read.
        Rootful Podman has none: its published ports are the network plugin's NAT rules only."""
        if self.kind == "podman":
            return False
        try:
            argv = [a.decode() for a in open(f"/proc/{self.daemon_pid()}/cmdline", "rb").read().split(b"\0") if a]
        except (OSError, LabError):
            return None
        return userland_proxy_setting(argv, _read_text)

    def ulimits(self) -> list[Any]:
        """Limits a container must be given explicitly: Podman asks the kernel for its own defaults (a million
        open files) when it has no CAP_SYS_RESOURCE to get them, and the container does not start. Given the
        engine's own hard limits instead, as Docker's containers inherit dockerd's."""
        if self.kind != "podman":
            return []
        import docker.types

        limits = process_limits(self.daemon_pid())
        return [docker.types.Ulimit(name=name, soft=limits[key], hard=limits[key])
                for name, key in (("nofile", "Max open files"), ("nproc", "Max processes")) if key in limits]

    def describe(self) -> dict[str, Any]:
        """For the record: what a result measured in this engine depends on."""
        info, ver = self.info, self.version
        return {"engine": self.kind, "url": self.url, "version": ver.get("Version"),
                "api_version": ver.get("ApiVersion"), "storage_driver": info.get("Driver"),
                "cgroup_driver": info.get("CgroupDriver"), "cgroup_version": info.get("CgroupVersion"),
                "security_options": info.get("SecurityOptions"), "default_runtime": info.get("DefaultRuntime"),
                "kernel": info.get("KernelVersion"), "userland_proxy": self.userland_proxy()}


def userland_proxy_setting(argv: list[str], read: Callable[[str], str | None]) -> bool | None:
    """dockerd's --userland-proxy from its command line `argv`, else from its configuration file (read with
    `read`, None when it does not exist), else Docker's default: on. None when the file cannot be parsed."""
    config = "/etc/docker/daemon.json"
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name == "--userland-proxy":
            if not eq:  # a bare flag is true; "--userland-proxy false" is not how Go's flags take booleans
                return True
            return value.lower() not in ("false", "0", "f")
        if name == "--config-file":
            config = value if eq else (argv[i + 1] if i + 1 < len(argv) else config)
    try:
        text = read(config)
        return True if text is None else bool(json.loads(text).get("userland-proxy", True))
    except (OSError, ValueError, AttributeError):
        return None


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def process_limits(pid: int) -> dict[str, int]:
    """A process's finite hard limits: {"Max open files": 20000, ...}."""
    with open(f"/proc/{pid}/limits") as f:
        return parse_limits(f.read())


def parse_limits(text: str) -> dict[str, int]:
    """/proc/PID/limits' finite hard limits. Its columns are fixed-width (the kernel's "%-25s %-20s %-20s"),
    and a limit's name has spaces in it, so it is cut by position, not split."""
    out: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        name, hard = line[:26].strip(), line[47:68].strip()
        if hard.isdigit():
            out[name] = int(hard)
    return out


def client_argv(kind: str, url: str) -> list[str]:
    """The engine's own command-line client, aimed at the engine at `url`."""
    return ["podman", "--remote", "--url", url] if kind == "podman" else ["docker", "-H", url]


def engine_url(kind: str = "docker") -> str:
    """Where the engine listens: ``DOCKER_HOST`` (Docker) or ``CONTAINER_HOST`` (Podman), as the engine's own
    client reads it, else its default socket."""
    return os.environ.get(URL_VARIABLES[kind]) or DEFAULT_URLS[kind]


def socket_path(url: str) -> str | None:
    parsed = urlparse(url)
    return parsed.path if parsed.scheme in ("unix", "") and parsed.path else None


def connect(kind: str = "docker") -> Engine:
    """The engine, reachable and answering; EnvironmentProblem saying what to do otherwise."""
    url = engine_url(kind)
    try:
        import docker
    except ImportError:
        raise EnvironmentProblem("the Docker SDK for Python is missing from vnetbench's environment: "
                                 "`make setup` installs it (pip install docker)") from None
    path = socket_path(url)
    if path is not None and not os.path.exists(path):
        raise EnvironmentProblem(
            f"{kind}: no engine listens at {url} -> " + _how_to_start(kind, url))
    program = client_argv(kind, url)[0]
    if shutil.which(program) is None:
        raise EnvironmentProblem(f"{kind}: its command-line client `{program}` is not installed, and workloads "
                                 f"run through it -> " + _how_to_start(kind, url))
    try:
        client = docker.DockerClient(base_url=url, timeout=API_TIMEOUT_S)
        version = client.version()
        info = client.info()
    except Exception as e:  # noqa: BLE001 - the SDK's errors (requests', docker's) all mean: not usable
        raise EnvironmentProblem(f"{kind} at {url} does not answer: {str(e)[:200]} -> "
                                 + _how_to_start(kind, url)) from None
    return Engine(kind, url, client, info, version)


def _how_to_start(kind: str, url: str) -> str:
    if kind == "docker":
        where = "" if url == DEFAULT_URLS[kind] else f" -H {url}"
        return (f"install it (apt-get install docker.io) and start it (`systemctl start docker`, or `dockerd{where} &` "
                "where there is no systemd); DOCKER_HOST chooses another engine")
    # Podman has no daemon of its own: its API is a service started on demand, which vnetbench talks to.
    return ("install it (apt-get install podman catatonit) and start its API service (`systemctl start podman.socket`, "
            f"or `podman system service --time=0 {url} &` where there is no systemd); CONTAINER_HOST chooses another")


def probe(kind: str = "docker") -> tuple[Engine | None, str]:
    """The engine and a one-line description, or None and why not (for doctor and preflight; once per
    process and engine address)."""
    return _probe(kind, engine_url(kind))


@lru_cache(maxsize=8)
def _probe(kind: str, url: str) -> tuple[Engine | None, str]:
    try:
        e = connect(kind)
    except EnvironmentProblem as why:
        return None, str(why)
    d = e.describe()
    return e, (f"{kind} {d['version']} at {e.url} ({d['storage_driver']}, cgroup v{d['cgroup_version']} "
               f"{d['cgroup_driver']})")


def exec_argv(engine: Engine, container: str, argv: Iterable[str], cpus: str | None = None,
              timed: bool = False) -> list[str]:
    """The argv that runs `argv` inside `container` (on `cpus`, when given; `timed`: saying its CPU time,
    nodes.exec_wrapper) and ends it when this client process ends; its standard input must be a pipe held
    open for as long as the command should run."""
    pin = ["-c", cpus] if cpus is not None else []
    return [*engine.cli, "exec", "-i", container, "/bin/vnb-exec", *(["-t"] if timed else []), *pin, *map(str, argv)]


# ---------------------------------------------------------------- the tools image

@dataclass
class ImagePlan:
    """Every file of the tools image: path in the image -> (host source, mode), plus busybox's applets."""

    files: dict[str, tuple[str, int]] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    applets: list[str] = field(default_factory=list)

    def add(self, path: str, source: str, mode: int) -> None:
        self.files.setdefault(path.strip("/"), (source, mode))


def image_tools() -> tuple[tuple[str, str], ...]:
    """(command, package) of everything a workload or the lab may run in a container."""
    from vnetbench.lab.guest import initramfs

    # tc: link conditions inside a cluster's pods (kube/conditions.py)
    basics = tuple((t.command, t.package) for t in (tools.IPERF3, tools.PING, tools.ETHTOOL, tools.TC))
    return tuple(dict.fromkeys(basics + initramfs.optional_tools()))


def plan_image() -> ImagePlan:
    from vnetbench.lab.guest import initramfs

    busybox = initramfs.find_busybox()
    if busybox is None:
        raise EnvironmentProblem("the container tools image needs busybox-static: apt-get install busybox-static")
    p = ImagePlan()
    p.add("bin/busybox", busybox, 0o755)
    p.tools, p.missing = initramfs.collect_tools(image_tools(), p.add)
    p.applets = initramfs.busybox_applets(busybox, exclude=p.tools)
    return p


def image_digest(p: ImagePlan) -> tuple[str, dict[str, str]]:
    """A digest of everything the image holds, and each file's sha256 (the image's manifest)."""
    from vnetbench.lab.guest import initramfs

    h = hashlib.sha256(f"format {IMAGE_FORMAT}\nwrapper {EXEC_WRAPPER}\n".encode())
    h.update(json.dumps(p.applets).encode() + json.dumps(sorted(initramfs.ETC_FILES.items()), default=repr).encode())
    sums = initramfs.hash_files(p.files, h)
    return h.hexdigest()[:20], sums


def render_image(p: ImagePlan) -> bytes:
    """The image's root file system as a tar archive (fixed order, owners and times: reproducible)."""
    from vnetbench.lab.guest import initramfs

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        def entry(name: str, kind: bytes, mode: int, data: bytes = b"", target: str = "") -> None:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.mtime, ti.uid, ti.gid = kind, mode, 0, 0, 0
            ti.linkname = target
            ti.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(ti, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        top = ("bin", "dev", "etc", "lib", "proc", "sys", "run", "var", "root", "usr")
        for d in top:
            entry(d, tarfile.DIRTYPE, 0o700 if d == "root" else 0o755)
        entry("tmp", tarfile.DIRTYPE, 0o1777)  # iperf3 and others make their temporary files here
        links = ("sbin", "usr/bin", "usr/sbin", "usr/local")
        for link in links:
            entry(link, tarfile.SYMTYPE, 0o777, target="/bin")
        made = {*top, "tmp", *links}
        for name in sorted(p.files):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                parent = "/".join(parts[:i])
                if parent not in made:
                    entry(parent, tarfile.DIRTYPE, 0o755)
                    made.add(parent)
            src, mode = p.files[name]
            with open(src, "rb") as f:
                entry(name, tarfile.REGTYPE, mode, f.read())
        for applet in p.applets:
            entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, target="busybox")
        for name, data in initramfs.ETC_FILES.items():
            entry(name, tarfile.REGTYPE, 0o644, data)
        entry("bin/vnb-exec", tarfile.REGTYPE, 0o755, EXEC_WRAPPER.encode())
    return out.getvalue()


@dataclass(frozen=True)
class ToolsImage:
    tag: str
    id: str
    digest: str
    built: bool  # False: found in the engine already
    manifest: dict[str, Any]


def tools_image(engine: Engine) -> ToolsImage:
    """The tools image in `engine`: found by its content digest, else built and imported (a few seconds)."""
    from vnetbench.lab.guest import initramfs

    p = plan_image()
    digest, sums = image_digest(p)
    tag = f"{IMAGE_REPOSITORY}:{digest}"
    manifest = {"digest": digest, "tools": p.tools, "missing_tools": p.missing,
                "packages": initramfs.packages_of(src for src, _ in p.files.values()), "files": len(sums)}
    import docker.errors

    try:
        found = engine.client.images.get(tag)
        return ToolsImage(tag, found.id, digest, False, manifest)
    except docker.errors.ImageNotFound:
        pass
    data = render_image(p)
    try:
        answer = engine.client.api.import_image_from_data(
            data, repository=IMAGE_REPOSITORY, tag=digest,
            changes=[f"LABEL {LABEL_IMAGE}={digest}", "ENV PATH=/bin", 'CMD ["/bin/sh"]'])
        # Tagged by id: Podman's Docker-compatible import ignores the tag asked for and names its image
        # "<repository>:latest" (Podman 4.3), which is then taken back so that no run depends on it.
        image_id = imported_id(answer)
        image = engine.client.images.get(image_id)
        image.tag(IMAGE_REPOSITORY, digest)
        if f"{IMAGE_REPOSITORY}:latest" in {t.rpartition("/")[2] for t in image.tags}:
            engine.client.images.remove(f"{IMAGE_REPOSITORY}:latest", noprune=True)
    except (docker.errors.APIError, ValueError) as e:
        raise LabError(f"{engine.kind} refused the tools image ({len(data) >> 20} MiB, {tag}): {e}") from None
    return ToolsImage(tag, image.id, digest, True, manifest)


def imported_id(answer: str) -> str:
    """The image id in an engine's answer to an import (a stream of JSON lines; the last names the image)."""
    for line in reversed(answer.strip().splitlines()):
        status = json.loads(line)
        if "error" in status:
            raise ValueError(status["error"])
        found = status.get("id") or status.get("status", "")
        if found.startswith("sha256:"):
            return found
    raise ValueError(f"no image id in the engine's answer: {answer[:200]!r}")


# ---------------------------------------------------------------- what runs left

def leftovers(engine: Engine, prefix: str) -> tuple[list[Any], list[Any]]:
    """Containers and networks labelled with a run prefix that starts with `prefix`."""
    containers = [c for c in engine.client.containers.list(all=True, filters={"label": LABEL_RUN})
                  if labelled(c, prefix)]
    networks = [n for n in engine.client.networks.list(filters={"label": LABEL_RUN}) if labelled(n, prefix)]
    return containers, networks


def labelled(obj: Any, *prefixes: str) -> bool:
    """Does a container or network carry the run label of a run whose names start with one of `prefixes`
    ("vnb-" for every run, "vnb-<id>-" for one: the form `vnetbench clean` and the namespaces use)?"""
    labels = obj.attrs.get("Labels") or (obj.attrs.get("Config") or {}).get("Labels") or {}
    value = labels.get(LABEL_RUN)
    return value is not None and f"{value}-".startswith(prefixes)


# CNI's host-local address allocator keeps a directory per network, which Podman (CNI backend) leaves behind
# when the network is removed: the run's networks' names are the run's, so their directories are too.
CNI_IPAM_STATE = Path("/var/lib/cni/networks")


def cni_state(prefix: str, skip: tuple[str, ...] = ()) -> list[Path]:
    """CNI address bookkeeping of networks named `prefix`... (but not one of `skip`...)."""
    try:
        found = [p for p in CNI_IPAM_STATE.iterdir() if p.name.startswith(prefix)]
    except OSError:  # no CNI here
        return []
    return sorted(p for p in found if not (skip and p.name.startswith(skip)))


def forget_cni_state(network: str) -> None:
    shutil.rmtree(CNI_IPAM_STATE / network, ignore_errors=True)


def images(engine: Engine) -> list[Any]:
    """Every tools image vnetbench imported into this engine."""
    return engine.client.images.list(filters={"label": LABEL_IMAGE})
