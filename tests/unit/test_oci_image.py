"""The OCI image layout vnetbench writes for containerd (vnetbench.lab.oci): every blob found by its digest,
the manifest's chain (index -> manifest -> config and layer) consistent, the name containerd reads, and the
same bytes from the same inputs. The real import by containerd is tested on the test cluster
(tests/integration/test_kube_cluster.py), whose pods run from these images."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import pytest

from vnetbench.lab import oci

REPO = Path(__file__).resolve().parents[2]


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def blob(files: dict[str, bytes], digest: str) -> bytes:
    data = files[f"blobs/sha256/{digest.removeprefix('sha256:')}"]
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    return data


def test_the_layout_chains_index_manifest_config_and_layer_by_digest():
    rootfs = oci.single_file_rootfs("pause", b"\x7fELF not really", 0o755)
    image = oci.image_layout("localhost/vnetbench/pause:1", rootfs, ["/pause"])
    files = members(image.archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    [entry] = index["manifests"]
    assert entry["digest"] == image.digest
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/vnetbench/pause:1"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "1"
    manifest = json.loads(blob(files, entry["digest"]))
    assert entry["size"] == len(blob(files, entry["digest"]))
    config = json.loads(blob(files, manifest["config"]["digest"]))
    [layer] = manifest["layers"]
    assert layer["mediaType"] == oci.LAYER_MEDIA_TYPE
    assert blob(files, layer["digest"]) == rootfs
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]  # uncompressed: the layer's digest is its diff id
    assert config["config"]["Entrypoint"] == ["/pause"]
    with tarfile.open(fileobj=io.BytesIO(rootfs)) as tar:
        [f] = tar.getmembers()
        assert (f.name, f.mode, f.mtime) == ("pause", 0o755, 0)


def test_the_same_inputs_give_the_same_bytes_and_a_new_file_a_new_digest():
    a = oci.image_layout("localhost/x:1", oci.single_file_rootfs("p", b"one"), ["/p"], {"PATH": "/bin"})
    b = oci.image_layout("localhost/x:1", oci.single_file_rootfs("p", b"one"), ["/p"], {"PATH": "/bin"})
    c = oci.image_layout("localhost/x:1", oci.single_file_rootfs("p", b"two"), ["/p"], {"PATH": "/bin"})
    assert a.archive == b.archive and a.digest == b.digest
    assert c.digest != a.digest
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", a.digest)


def test_a_name_without_a_tag_is_refused():
    with pytest.raises(ValueError, match="no tag"):
        oci.image_layout("localhost/vnetbench/pause", b"", ["/pause"])


def test_the_test_clusters_kubernetes_version_is_one_everywhere():
    """The Makefile builds it, the wrapper module pins it, the harness finds it by it."""
    import kubecluster

    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^KUBE_VERSION := (\S+)$", makefile, re.M).group(1) == kubecluster.VERSION
    gomod = (REPO / "kube" / "go.mod").read_text()
    assert re.search(r"^\tk8s\.io/kubernetes (\S+)$", gomod, re.M).group(1) == kubecluster.VERSION
    staging = set(re.findall(r"^\tk8s\.io/[\w-]+ => k8s\.io/[\w-]+ (\S+)$", gomod, re.M))
    assert staging == {kubecluster.VERSION.replace("v1.", "v0.")}
