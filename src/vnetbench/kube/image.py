"""vnetbench's tools image for a cluster's nodes: the same root file system as the container engines' tools
image (:func:`vnetbench.lab.engines.render_image`, built from this machine's files), as an OCI image layout
(:mod:`vnetbench.lab.oci`) that ``ctr -n k8s.io images import`` loads on a node. Its tag is its content
digest, so a node that has it has exactly this machine's tools; a pod's process is an idle ``sleep``, and the
workloads are exec'd into it."""

from __future__ import annotations

from vnetbench.lab import engines, oci

REPOSITORY = "localhost/vnetbench/tools"
IDLE = ["/bin/sleep", "2147483647"]


def tools_image_name() -> str:
    """The image's name, from the digest of its content (without writing the image)."""
    digest, _ = engines.image_digest(engines.plan_image())
    return f"{REPOSITORY}:{digest}"


def tools_image() -> oci.OciImage:
    """The image, as an OCI image-layout tar in memory (a few tens of MiB)."""
    plan = engines.plan_image()
    digest, _ = engines.image_digest(plan)
    return oci.image_layout(f"{REPOSITORY}:{digest}", engines.render_image(plan), IDLE, {"PATH": "/bin"})
