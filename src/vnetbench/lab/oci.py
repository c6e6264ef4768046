"""An OCI image layout (one uncompressed layer) written from a root file system tar, for runtimes that take an
image from a file rather than from a registry: ``ctr -n k8s.io images import`` puts it where a Kubernetes
node's containerd finds it (pods then use ``imagePullPolicy: Never``).

The layout is the OCI image-spec's (v1.1): ``oci-layout``, ``index.json`` and content-addressed blobs (the
layer, the image config, the manifest). containerd names the image from the manifest's
``io.containerd.image.name`` annotation. Every byte is fixed by the inputs (no times, sorted keys), so one
root file system gives one digest on any machine: the digest a run stores is the image's identity.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class OciImage:
    name: str  # registry/repository:tag, as containerd will list it
    digest: str  # the manifest's, "sha256:...": what a node reports as the image's digest
    archive: bytes  # the layout as a tar, for `ctr images import`


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def image_layout(name: str, rootfs: bytes, entrypoint: list[str], env: dict[str, str] | None = None,
                 labels: dict[str, str] | None = None) -> OciImage:
    """The OCI image `name` whose one layer is `rootfs` (an uncompressed tar) and whose process is
    `entrypoint`, as an image-layout tar."""
    if ":" not in name.rpartition("/")[2]:
        raise ValueError(f"image name {name!r} has no tag (repository:tag)")
    config = _json({"architecture": "amd64", "os": "linux",
                    "config": {"Entrypoint": entrypoint,
                               "Env": [f"{k}={v}" for k, v in (env or {"PATH": "/bin:/usr/bin:/sbin:/usr/sbin"}).items()],
                               "Labels": labels or {}},
                    "rootfs": {"type": "layers", "diff_ids": [_digest(rootfs)]}})
    manifest = _json({"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
                      "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": _digest(config), "size": len(config)},
                      "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": _digest(rootfs), "size": len(rootfs)}]})
    index = _json({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                   "manifests": [{"mediaType": MANIFEST_MEDIA_TYPE, "digest": _digest(manifest),
                                  "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
                                  "annotations": {"io.containerd.image.name": name,
                                                  "org.opencontainers.image.ref.name": name.rpartition(":")[2]}}]})
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(path: str, data: bytes) -> None:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        add("index.json", index)
        for blob in (rootfs, config, manifest):
            add(f"blobs/sha256/{_digest(blob)[7:]}", blob)
    return OciImage(name, _digest(manifest), out.getvalue())


def single_file_rootfs(path: str, data: bytes, mode: int = 0o755) -> bytes:
    """A root file system of one file (a static program, such as a pod sandbox's pause) as a tar."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo(path.strip("/"))
        info.size, info.mode, info.mtime = len(data), mode, 0
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
