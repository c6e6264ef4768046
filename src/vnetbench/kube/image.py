"""vnetbench's tools image for a cluster's nodes: the same root file system as the container engines' tools
image (:func:`vnetbench.lab.engines.render_image`, built from this machine's files), as an OCI image layout
(:mod:`vnetbench.lab.oci`) that ``ctr -n k8s.io images import`` loads on a node. Its tag is its content
digest, so a node that has it has exactly this machine's tools; a pod's process is an idle ``sleep``, and the
workloads are exec'd into it.

A cluster whose nodes pull their images takes it from a registry instead: :func:`push` copies it there with
skopeo (Debian's; the containers/image library Podman and CRI-O pull with, so the registry's authentication
and TLS settings are the user's own: ``skopeo login``, ``/etc/containers/registries.d``), as
``REGISTRY/vnetbench/tools:DIGEST``. A registry stores layers compressed, so the digest the nodes see is the
pushed manifest's, which :func:`push` returns for the run to store."""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vnetbench.errors import EnvironmentProblem
from vnetbench.lab import engines, oci
from vnetbench.tools import SKOPEO

REPOSITORY = "localhost/vnetbench/tools"
PUSHED_REPOSITORY = "vnetbench/tools"  # under the registry the user names
IDLE = ["/bin/sleep", "2147483647"]
PUSH_TIMEOUT_S = 600  # tens of MiB, compressed on the way
# host[:port][/path], as an image reference starts (no scheme, no tag): the registry and a path in it
REGISTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*")


@dataclass(frozen=True)
class Pushed:
    name: str  # REGISTRY/vnetbench/tools:TAG, what the pods name
    digest: str  # "sha256:...", the manifest's in the registry: what the nodes report as the image's digest


def tools_image_name() -> str:
    """The image's name, from the digest of its content (without writing the image)."""
    digest, _ = engines.image_digest(engines.plan_image())
    return f"{REPOSITORY}:{digest}"


def tools_image(repository: str = REPOSITORY) -> oci.OciImage:
    """The image, named `repository`:DIGEST, as an OCI image-layout tar in memory (a few tens of MiB)."""
    plan = engines.plan_image()
    digest, _ = engines.image_digest(plan)
    return oci.image_layout(f"{repository}:{digest}", engines.render_image(plan), IDLE, {"PATH": "/bin"})


def registry_address(value: str) -> str:
    """`value` as a registry's address (host[:port][/path], a trailing / dropped); ValueError saying what it
    must look like otherwise."""
    address = value.rstrip("/")
    if not REGISTRY.fullmatch(address):
        raise ValueError(f"{value!r} is not a registry's address: host[:port][/path], without a scheme or a tag "
                         "(\"registry.example:5000/team\")")
    return address


def pushed_name(registry: str) -> str:
    """The tools image's name in `registry` (host[:port][/path]): its tag is the content's digest, as locally."""
    return f"{registry}/{PUSHED_REPOSITORY}:{tools_image_name().rpartition(':')[2]}"


def push(registry: str, tls_verify: bool = True) -> Pushed:
    """The tools image copied to `registry` by skopeo (layers the registry has are not sent again);
    EnvironmentProblem naming the registry, skopeo's reason and what to do when it cannot be."""
    if SKOPEO.path() is None:
        raise EnvironmentProblem(f"pushing the tools image to {registry} needs skopeo: apt-get install "
                                 f"{SKOPEO.package} (make setup does)")
    image = tools_image(f"{registry}/{PUSHED_REPOSITORY}")
    name = image.name
    with tempfile.TemporaryDirectory(prefix="vnb-image-") as tmp:
        archive, digest_file = Path(tmp) / "tools.oci.tar", Path(tmp) / "digest"
        archive.write_bytes(image.archive)
        argv = [SKOPEO.command, "copy", "--quiet", f"--dest-tls-verify={'true' if tls_verify else 'false'}",
                "--digestfile", str(digest_file), f"oci-archive:{archive}", f"docker://{name}"]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=PUSH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise EnvironmentProblem(f"pushing the tools image to {registry}: no answer in {PUSH_TIMEOUT_S} s "
                                     "(is the registry reachable from this machine?)") from None
        if p.returncode != 0:
            said = skopeo_reason(p.stderr)
            untrusted = "HTTP response to HTTPS client" in said or "x509:" in said  # plain HTTP; a certificate
            hint = ("; a registry over plain HTTP or with a certificate this machine does not trust needs "
                    "kube.registry_tls_verify = false" if tls_verify and untrusted else "")
            raise EnvironmentProblem(f"pushing the tools image to {registry} (skopeo copy ... docker://{name}) "
                                     f"failed: {said}{hint}; check the address, and log in with `skopeo login "
                                     f"{registry.split('/')[0]}` if it asks for credentials")
        digest = digest_file.read_text().strip()
    return Pushed(name, digest)


def skopeo_reason(stderr: str) -> str:
    """What skopeo said went wrong: its last log line's message (``time=... level=fatal msg="..."``)."""
    last = (stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
    m = re.search(r'msg="((?:[^"\\]|\\.)*)"', last)
    return m.group(1).replace('\\"', '"') if m else last
