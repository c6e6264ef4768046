"""A real Kubernetes cluster for tests: one control plane and two nodes on this machine, from binaries built
from source (kube/: `make kube`), touching nothing of the machine's. The nodes have vnetbench's tools image
loaded, as a user without a registry loads it; a registry beside the API (Debian's docker-registry, the CNCF
distribution registry, unpacked by `make kube` without installing its service) is there for runs that push it.

Layout (every address in 198.18.0.0/15, inside namespaces made here; the machine's namespace gets none):

  vnbtest-k8s-<pid>-cp   etcd (loopback), kube-apiserver on 198.18.254.254:6443, controller-manager and
                         scheduler (loopback), and the fabric bridge fab0 (198.18.254.254/24) the nodes join
  vnbtest-k8s-<pid>-nN   N = 1, 2: a veth u0 on fab0 (198.18.254.N/24), its own containerd and kubelet
                         (kubelet on 198.18.254.N:10250), the CNI bridge cni0 with pods in 198.18.N.0/24,
                         and a VXLAN device flannel.1 carrying pod traffic to the other node, programmed as
                         flannel's VXLAN backend programs it (static neighbour, fdb and route entries),
                         or (backend "host-gw", flannel's other backend) a route to each other node's pod
                         subnet through that node's fabric address, nothing encapsulated;
                         kube-proxy in nftables mode for ClusterIP Services (198.18.128.0/24), its rules
                         in the node's own namespace (tables ip/ip6 kube-proxy)

Each node runs in a mount namespace of its own (``unshare --mount``; the machine's root mount is private, so
nothing made there reaches the machine): /var/lib, /var/log and /run/netns are the node's own directories,
and the three sysctls the kubelet insists on changing for the whole machine (vm.overcommit_memory,
kernel.panic, kernel.panic_on_oops) are files bind-mounted over /proc/sys, so the machine's values stay.
A kubelet and its containerd share the network namespace (containerd's exec streaming server listens on
its loopback) and the mount namespace. The pods' cgroups live under /vnbtest-k8s-<pid>-nN in each
hierarchy (cgroupfs: PID 1 is not systemd; cgroup v1 here, which Kubernetes 1.34 still runs on).

Two settings this machine needs: containerd's ``restrict_oom_score_adj`` and the kubelet's ``oomScoreAdj: 0``
(no process here has CAP_SYS_RESOURCE, so a negative oom_score_adj fails and runc with it).

Clients reach the API only from inside the control plane's namespace: :meth:`KubeCluster.enter` is the
argv prefix that runs a program there (vnetbench itself, or a test's client script).

The research behind it, with what each setting settles: ../shared/research/kubernetes-offline-cluster.md.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from engine_daemon import processes_naming, unmount_under
from vnetbench.kube import image as kube_image
from vnetbench.lab import oci

REPO = Path(__file__).resolve().parent.parent
VERSION = "v1.34.4"
NETNS_PREFIX = "vnbtest-k8s-"  # not vnb-*: `vnetbench clean` must never take it for a run's
API_ADDRESS = "198.18.254.254"
API_URL = f"https://{API_ADDRESS}:6443"
REGISTRY = f"{API_ADDRESS}:5000"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the registry is the fabric's: no proxy
SERVICE_RANGE = "198.18.128.0/24"
POD_CIDR = "198.18.0.0/20"  # every node's pod subnet, 198.18.N.0/24
POD_MTU = 1450  # 1500 less the VXLAN header (50 bytes), as flannel sets it
# The pod network's MTU for each of the two backends the cluster offers, as flannel sets them: VXLAN's 50 bytes
# less than the fabric's 1500, host-gw's the fabric's own (its packets are routed, not wrapped).
BACKENDS = {"vxlan": POD_MTU, "host-gw": 1500}
PAUSE_IMAGE = "localhost/vnetbench/pause:1"
START_TIMEOUT_S = 180
PROGRAMS = ("containerd", "ctr", "runc", "nsenter", "unshare", "openssl", "gcc")
PACKAGES = "containerd runc util-linux openssl gcc libc6-dev containernetworking-plugins"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CLONE_NEWNET = 0x40000000


def cache_dir() -> Path:
    """Where `make kube` leaves the binary (and its Go caches): outside the repository, kept between runs."""
    return Path(os.environ.get("VNB_KUBE_CACHE", Path.home() / ".cache" / "vnetbench" / "kube"))


def binary() -> Path:
    return cache_dir() / f"kube-{VERSION}" / "kube"


def registry_binary() -> Path:
    """Debian's docker-registry program, unpacked from its package by `make kube` (installing the package
    would start a registry on the machine's every address)."""
    return cache_dir() / "registry" / "docker-registry"


def missing() -> str | None:
    """Why a test cluster cannot be started here (None: it can)."""
    if not binary().exists():
        return f"the Kubernetes binary {binary()} is not built: run `make kube` (about 10 minutes the first time)"
    if not registry_binary().exists():
        return f"the image registry {registry_binary()} is not unpacked: run `make kube`"
    for program in PROGRAMS:
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install {PACKAGES}; make setup does)"
    if not Path("/usr/lib/cni/bridge").exists():
        return "the CNI plugins are not installed (apt-get install containernetworking-plugins; make setup does)"
    if os.geteuid() != 0:
        return "a test cluster needs root"
    return None


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: the test cluster offers {', '.join(BACKENDS)}")


class KubeCluster:
    """A started cluster: ``kubeconfig`` (admin), ``tenant_kubeconfig`` (a user with no rights but the tests'
    Roles, user name "tenant"), ``nodes`` (names), ``enter`` (argv prefix into its
    network), ``tools_image`` (the vnetbench tools image on every node), ``stop()``."""

    def __init__(self, home: Path, nodes: int = 2, backend: str = "vxlan"):
        _check_backend(backend)
        self.home = home
        self.backend = backend
        self.tag = f"{NETNS_PREFIX}{os.getpid()}"
        self.cp_netns = f"{self.tag}-cp"
        self.nodes = [f"node{n}" for n in range(1, nodes + 1)]
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.made_netns: list[str] = []
        self.admin_token = secrets.token_hex(16)
        self.kubeconfig = home / "admin.kubeconfig"
        # A user in no group: what it may do is what the tests' Roles give it (a team that may not make namespaces).
        self.tenant_token = secrets.token_hex(16)
        self.tenant_kubeconfig = home / "tenant.kubeconfig"
        self.tools_image: oci.OciImage | None = None
        self.last_api_error = ""
        self.machine_sysctls = machine_sysctls()  # as they were before: the nodes must not change them

    # -- where things are ------------------------------------------------------------------------------
    def node_netns(self, node: str) -> str:
        return f"{self.tag}-n{node.removeprefix('node')}"

    def node_dir(self, node: str) -> Path:
        return self.home / node

    def node_address(self, node: str) -> str:
        return f"198.18.254.{node.removeprefix('node')}"

    def pod_subnet(self, node: str) -> str:
        return f"198.18.{node.removeprefix('node')}.0/24"

    @property
    def pod_mtu(self) -> int:
        """The MTU the CNI gives the pods it makes now (its backend's)."""
        return BACKENDS[self.backend]

    def enter(self) -> list[str]:
        """The argv prefix that runs a program in the control plane's network, where the API is."""
        return ["nsenter", f"--net=/run/netns/{self.cp_netns}"]

    @contextmanager
    def entered(self) -> Iterator[None]:
        """This thread (and the threads and processes it starts) in the control plane's network while inside:
        what a test body needs to use vnetbench's Kubernetes code directly. Back where it was after."""
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{self.cp_netns}") as cp:
            if libc.setns(cp.fileno(), CLONE_NEWNET):
                raise OSError(ctypes.get_errno(), f"setns into {self.cp_netns}")
            try:
                yield
            finally:
                if libc.setns(home.fileno(), CLONE_NEWNET):
                    raise OSError(ctypes.get_errno(), "setns back to the test's own network")

    def kube(self, component: str) -> list[str]:
        return [str(binary()), component]

    # -- bring-up ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._network()
        self._registry()
        self._certificates()
        self._control_plane()
        images = self._images()
        for node in self.nodes:
            self._node(node, images)
        self._wait_ready()

    def _ip(self, *args: str, netns: str | None = None) -> None:
        argv = ["ip", *(["-n", netns] if netns else []), *args]
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")

    def _netns(self, name: str) -> None:
        self._ip("netns", "add", name)
        self.made_netns.append(name)
        self._ip("link", "set", "lo", "up", netns=name)

    def _network(self) -> None:
        """The fabric (a bridge in the control plane's namespace), each node's veth onto it, and the links
        between the nodes' pod networks (the backend's)."""
        self._netns(self.cp_netns)
        self._ip("link", "add", "fab0", "type", "bridge", netns=self.cp_netns)
        self._ip("addr", "add", f"{API_ADDRESS}/24", "dev", "fab0", netns=self.cp_netns)
        self._ip("link", "set", "fab0", "up", netns=self.cp_netns)
        for node in self.nodes:
            ns, n = self.node_netns(node), node.removeprefix("node")
            self._netns(ns)
            self._ip("link", "add", "u0", "netns", ns, "type", "veth", "peer", "name", f"f{n}", "netns",
                     self.cp_netns)
            self._ip("link", "set", f"f{n}", "master", "fab0", "up", netns=self.cp_netns)
            self._ip("addr", "add", f"{self.node_address(node)}/24", "dev", "u0", netns=ns)
            self._ip("link", "set", "u0", "up", netns=ns)
            # A node's own processes (hostNetwork pods) reach a ClusterIP as on a real node, where the default
            # route takes it: the route decides before kube-proxy's DNAT does, and a node here has no default.
            self._ip("route", "add", SERVICE_RANGE, "dev", "u0", netns=ns)
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
        self._pod_links()

    def _pod_links(self) -> None:
        """What carries pod traffic between the nodes, as flannel's backend of that name programs it."""
        if self.backend == "host-gw":
            for node in self.nodes:
                for peer in self.nodes:
                    if peer != node:
                        self._ip("route", "add", self.pod_subnet(peer), "via", self.node_address(peer), "dev",
                                 "u0", netns=self.node_netns(node))
            return
        macs = {}
        for node in self.nodes:
            ns, n = self.node_netns(node), node.removeprefix("node")
            self._ip("link", "add", "flannel.1", "type", "vxlan", "id", "1", "local", self.node_address(node),
                     "dev", "u0", "dstport", "8472", "nolearning", netns=ns)
            self._ip("link", "set", "flannel.1", "mtu", str(POD_MTU), "up", netns=ns)
            self._ip("addr", "add", f"198.18.{n}.0/32", "dev", "flannel.1", netns=ns)
            macs[node] = json.loads(subprocess.run(["ip", "-n", ns, "-j", "link", "show", "flannel.1"],
                                                   capture_output=True, text=True, check=True).stdout)[0]["address"]
        for node in self.nodes:
            ns = self.node_netns(node)
            for peer in self.nodes:
                if peer == node:
                    continue
                p = peer.removeprefix("node")
                self._ip("neigh", "add", f"198.18.{p}.0", "lladdr", macs[peer], "dev", "flannel.1", "nud",
                         "permanent", netns=ns)
                subprocess.run(["bridge", "-n", ns, "fdb", "append", macs[peer], "dev", "flannel.1", "dst",
                                self.node_address(peer)], check=True)
                self._ip("route", "add", self.pod_subnet(peer), "via", f"198.18.{p}.0", "dev", "flannel.1",
                         "onlink", netns=ns)

    def _remove_pod_links(self) -> None:
        for node in self.nodes:
            ns = self.node_netns(node)
            if self.backend == "host-gw":
                for peer in self.nodes:
                    if peer != node:
                        self._ip("route", "del", self.pod_subnet(peer), netns=ns)
            else:
                self._ip("link", "del", "flannel.1", netns=ns)  # its neighbours, fdb entries and routes with it

    def _write_cni_config(self, node: str) -> None:
        d = self.node_dir(node)
        (d / "net.d" / "10-vnbtest.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "vnbtest", "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "mtu": self.pod_mtu, "ipam": {"type": "host-local", "dataDir": str(d / "ipam"),
                                              "ranges": [[{"subnet": self.pod_subnet(node)}]],
                                              "routes": [{"dst": "0.0.0.0/0"}]}}]}))

    @contextmanager
    def using_backend(self, backend: str) -> Iterator["KubeCluster"]:
        """The cluster with pod traffic between the nodes carried by `backend` while inside, as a cluster
        built with it: the links re-programmed and the CNI's MTU its own for the pods made from then on (pods
        made before keep theirs, as on a cluster whose CNI changed: make none across the switch). Back to
        the backend it had after: the links as they were (test_kube_run.py's backend test says what a pod's tbf
        carried before and after)."""
        _check_backend(backend)
        before = self.backend
        self._switch(backend)
        try:
            yield self
        finally:
            self._switch(before)

    def _switch(self, backend: str) -> None:
        if backend == self.backend:
            return
        self._remove_pod_links()
        self.backend = backend
        self._pod_links()
        for node in self.nodes:
            self._write_cni_config(node)
            # The CNI sets its bridge's MTU only when it makes it (with a node's first pod): set here, the
            # bridge, the gateway the nodes route pod traffic through, carries what the new MTU allows.
            ns = self.node_netns(node)
            if subprocess.run(["ip", "-n", ns, "link", "show", "cni0"], capture_output=True).returncode == 0:
                self._ip("link", "set", "cni0", "mtu", str(self.pod_mtu), netns=ns)

    def _registry(self) -> None:
        """The registry on the fabric, its storage in the cluster's home (gone with it)."""
        config = self.home / "registry.yml"
        config.write_text(json.dumps({  # YAML's superset: JSON
            "version": 0.1, "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.home / "registry")}},
            "http": {"addr": REGISTRY}}))
        self._spawn("registry", ["ip", "netns", "exec", self.cp_netns, str(registry_binary()), "serve", str(config)])

        def up() -> bool:
            with self.entered():
                try:
                    return DIRECT.open(f"http://{REGISTRY}/v2/", timeout=2).status == 200
                except OSError:
                    return False

        self._wait("the registry answering", up, ("registry",), timeout=30)

    def registry_tags(self, repository: str) -> list[str]:
        """What the registry holds of `repository` (its tags; none: [])."""
        with self.entered():
            try:
                with DIRECT.open(f"http://{REGISTRY}/v2/{repository}/tags/list", timeout=5) as r:
                    return json.load(r).get("tags") or []
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return []
                raise

    def _openssl(self, *args: str) -> None:
        p = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=self.home)
        if p.returncode:
            raise RuntimeError(f"openssl {' '.join(args)}: {p.stderr.strip()[-500:]}")

    def _certificates(self) -> None:
        """A CA; the client certificate the apiserver shows the kubelets (they trust the CA); the service
        accounts' key pair. The apiserver makes its own serving certificate; clients skip its check (the
        cluster lives minutes, on addresses no one else has)."""
        pki = self.home / "pki"
        pki.mkdir()
        self._openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "pki/ca.key", "-out", "pki/ca.crt",
                      "-days", "2", "-subj", "/CN=vnbtest-k8s-ca")
        self._openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "pki/kc.key", "-out", "pki/kc.csr",
                      "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client")
        self._openssl("x509", "-req", "-in", "pki/kc.csr", "-CA", "pki/ca.crt", "-CAkey", "pki/ca.key",
                      "-CAcreateserial", "-out", "pki/kc.crt", "-days", "2")
        self._openssl("genrsa", "-out", "pki/sa.key", "2048")
        self._openssl("rsa", "-in", "pki/sa.key", "-pubout", "-out", "pki/sa.pub")
        tokens = [f'{self.admin_token},admin,admin,"system:masters"', f"{self.tenant_token},tenant,tenant"]
        self.node_tokens = {node: secrets.token_hex(16) for node in self.nodes}
        tokens += [f'{tok},system:node:{node},{node},"system:nodes"' for node, tok in self.node_tokens.items()]
        (pki / "tokens.csv").write_text("\n".join(tokens) + "\n")
        self._write_kubeconfig(self.kubeconfig, self.admin_token)
        self._write_kubeconfig(self.tenant_kubeconfig, self.tenant_token)

    def _write_kubeconfig(self, path: Path, token: str) -> None:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "vnbtest",
            "clusters": [{"name": "vnbtest", "cluster": {"server": API_URL, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "vnbtest", "user": {"token": token}}],
            "contexts": [{"name": "vnbtest", "context": {"cluster": "vnbtest", "user": "vnbtest"}}]}, indent=1))

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.home / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        self.procs.append((name, proc))
        return proc

    def log_tail(self, name: str, n: int = 3000) -> str:
        try:
            return (self.home / f"{name}.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _wait(self, what: str, ready, proc_names: tuple[str, ...], timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self.procs:
                if name in proc_names and proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}) before {what}:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}:\n{self.log_tail(n, 1500)}" for n in proc_names)
                raise RuntimeError(f"{what}: not within {timeout:.0f} s (the API's last answer: "
                                   f"{self.last_api_error or 'none'})\n{logs}")
            time.sleep(0.5)

    def _control_plane(self) -> None:
        cp, pki = self.home / "cp", self.home / "pki"
        cp.mkdir()
        enter = self.enter()
        self._spawn("etcd", [*enter, *self.kube("etcd"), "--name", "cp", "--data-dir", str(cp / "etcd"),
                             "--listen-client-urls", "http://127.0.0.1:2379",
                             "--advertise-client-urls", "http://127.0.0.1:2379",
                             "--listen-peer-urls", "http://127.0.0.1:2380",
                             "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                             "--initial-cluster", "cp=http://127.0.0.1:2380", "--unsafe-no-fsync"])
        self._spawn("kube-apiserver", [
            *enter, *self.kube("kube-apiserver"), "--etcd-servers", "http://127.0.0.1:2379",
            "--bind-address", API_ADDRESS, "--advertise-address", API_ADDRESS, "--secure-port", "6443",
            "--cert-dir", str(cp / "serving"), "--token-auth-file", str(pki / "tokens.csv"),
            "--authorization-mode", "Node,RBAC", "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-cluster-ip-range", SERVICE_RANGE, "--allow-privileged=true",
            "--kubelet-client-certificate", str(pki / "kc.crt"), "--kubelet-client-key", str(pki / "kc.key"),
            "--kubelet-preferred-address-types", "InternalIP", "--profiling=false"])
        self._wait("the API server answers", self._api_up, ("etcd", "kube-apiserver"))
        self._spawn("kube-controller-manager", [
            *enter, *self.kube("kube-controller-manager"), "--kubeconfig", str(self.kubeconfig),
            "--leader-elect=false", "--controllers", "serviceaccount,namespace,garbagecollector,endpointslice",
            "--use-service-account-credentials=false", "--bind-address", "127.0.0.1"])
        self._spawn("kube-scheduler", [*enter, *self.kube("kube-scheduler"), "--kubeconfig", str(self.kubeconfig),
                                       "--leader-elect=false", "--bind-address", "127.0.0.1"])

    def api(self, path: str, body: dict | None = None) -> dict | None:
        """GET an API path (POST `body` to it, if given) with the admin token, from inside the control
        plane's network: Python's own urllib run there (the kube binary has no client). None: no answer."""
        code = ("import json,ssl,sys,urllib.request as u\n"
                "c=ssl.create_default_context();c.check_hostname=False;c.verify_mode=ssl.CERT_NONE\n"
                "body=sys.argv[2].encode() if sys.argv[2] else None\n"
                f"r=u.Request('{API_URL}/'+sys.argv[1],data=body,headers={{'Authorization':'Bearer {self.admin_token}',"
                "'Content-Type':'application/json'})\n"
                "print(u.urlopen(r,context=c,timeout=5).read().decode())\n")
        p = subprocess.run([*self.enter(), "python3", "-c", code, path.lstrip("/"), json.dumps(body) if body else ""],
                           capture_output=True, text=True)
        self.last_api_error = p.stderr.strip()[-600:]
        return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else None

    def _api_up(self) -> bool:
        return self.api("api/v1/namespaces/default") is not None

    def _images(self) -> list[Path]:
        """The sandbox (pause) image and vnetbench's tools image, as OCI layouts for `ctr images import`."""
        pause_bin = cache_dir() / "pause"
        if not pause_bin.exists():
            p = subprocess.run(["gcc", "-Os", "-static", "-s", "-o", str(pause_bin), str(REPO / "kube" / "pause.c")],
                               capture_output=True, text=True)
            if p.returncode:
                raise RuntimeError(f"building the pause program: {p.stderr[-1000:]}")
        pause = oci.image_layout(PAUSE_IMAGE, oci.single_file_rootfs("pause", pause_bin.read_bytes()), ["/pause"])
        self.tools_image = kube_image.tools_image()
        paths = []
        for image, name in ((pause, "pause"), (self.tools_image, "tools")):
            path = self.home / f"{name}.oci.tar"
            path.write_bytes(image.archive)
            paths.append(path)
        return paths

    def _node(self, node: str, images: list[Path]) -> None:
        """A node: its directories, containerd's and the kubelet's configuration, its cgroups; then containerd
        and the kubelet in the node's network and a mount namespace of their own."""
        d = self.node_dir(node)
        for sub in ("varlib", "varlog", "netns", "net.d", "sysctl", "ipam"):
            (d / sub).mkdir(parents=True)
        for name, value in (("overcommit_memory", "1"), ("panic", "10"), ("panic_on_oops", "1")):
            (d / "sysctl" / name).write_text(value + "\n")
        template = (REPO / "kube" / "containerd-node.toml").read_text()
        (d / "containerd.toml").write_text(template.replace("NODE", str(d)))
        (d / "certs.d" / REGISTRY).mkdir(parents=True)
        (d / "certs.d" / REGISTRY / "hosts.toml").write_text(
            f'server = "http://{REGISTRY}"\n[host."http://{REGISTRY}"]\n  capabilities = ["pull", "resolve"]\n')
        self._write_cni_config(node)
        cgroup_root = f"/{self.node_netns(node)}"
        self._make_cgroups(cgroup_root)
        self._write_kubeconfig(d / "kubelet.kubeconfig", self.node_tokens[node])
        (d / "kubelet.json").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.node_address(node), "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"x509": {"clientCAFile": str(self.home / "pki" / "ca.crt")},
                               "anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": cgroup_root, "cgroupsPerQOS": True,
            "oomScoreAdj": 0, "protectKernelDefaults": False, "resolvConf": "",
            "containerRuntimeEndpoint": f"unix://{d / 'containerd.sock'}",
            "evictionHard": {"memory.available": "10Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99, "maxPods": 16,
            "failSwapOn": False, "serializeImagePulls": False, "registerNode": True,
            "podLogsDir": "/var/log/pods", "localStorageCapacityIsolation": False}))
        ctr = f"ctr -a {d / 'containerd.sock'}"
        script = "\n".join([
            "set -e",
            *[f"mount --bind {d / 'sysctl' / name} /proc/sys/{path}"
              for name, path in (("overcommit_memory", "vm/overcommit_memory"), ("panic", "kernel/panic"),
                                 ("panic_on_oops", "kernel/panic_on_oops"))],
            f"mount --bind {d / 'varlib'} /var/lib",
            f"mount --bind {d / 'varlog'} /var/log",
            f"mount --bind {d / 'netns'} /run/netns",
            f"containerd --config {d / 'containerd.toml'} >{d / 'containerd.log'} 2>&1 &",
            f"i=0; until {ctr} version >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 300 ] || exit 3; sleep 0.1; done",
            *[f"{ctr} -n k8s.io images import {path} >/dev/null" for path in images],
            f"exec {binary()} kubelet --config {d / 'kubelet.json'} --kubeconfig {d / 'kubelet.kubeconfig'}"
            f" --hostname-override {node} --node-ip {self.node_address(node)}"
            f" --pod-infra-container-image {PAUSE_IMAGE}",
        ])
        self._spawn(f"kubelet-{node}", ["nsenter", f"--net=/run/netns/{self.node_netns(node)}", "unshare",
                                         "--mount", "--propagation", "private", "sh", "-c", script])
        # kube-proxy in nftables mode: ClusterIP Services as the node's own nftables rules (table ip kube-proxy and
        # ip6 kube-proxy, in the node's network namespace only). The conntrack limits are the machine's, not a
        # node's to change: left alone (maxPerCore 0).
        (d / "kube-proxy.json").write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "mode": "nftables",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)}, "hostnameOverride": node,
            "bindAddress": self.node_address(node), "clusterCIDR": POD_CIDR,
            "healthzBindAddress": "", "metricsBindAddress": "",
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                          "udpTimeout": "0s", "udpStreamTimeout": "0s"}}))
        self._spawn(f"kube-proxy-{node}", ["nsenter", f"--net=/run/netns/{self.node_netns(node)}", str(binary()),
                                           "kube-proxy", "--config", str(d / "kube-proxy.json")])

    def _make_cgroups(self, root: str) -> None:
        """The node's root cgroup in every v1 hierarchy (the kubelet requires it to exist); cpuset's takes
        its parent's CPUs and memory nodes, as a v1 cpuset starts with none."""
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            if not (hierarchy / "cgroup.procs").exists() or hierarchy.name == "unified":
                continue
            path = hierarchy / root.lstrip("/")
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (path / key).write_text((hierarchy / key).read_text())

    def node_qdiscs(self) -> dict[str, list[tuple[str, str, str]]]:
        """Every node's own network's shaping and steering qdiscs (tbf, htb, netem, clsact, ingress), (device, kind,
        handle) each, and its IFB devices ("ifb", name, ""): what a run that conditions only its pods must leave as
        it was. (The pods' veths come and go with their pods: their default qdiscs are not compared.)"""
        out = {}
        for node in self.nodes:
            enter = ["ip", "netns", "exec", self.node_netns(node)]
            qdiscs = json.loads(subprocess.run([*enter, "tc", "-j", "qdisc", "show"], capture_output=True, text=True,
                                               check=True, timeout=30).stdout or "[]")
            links = json.loads(subprocess.run([*enter, "ip", "-d", "-j", "link", "show"], capture_output=True,
                                              text=True, check=True, timeout=30).stdout or "[]")
            out[node] = sorted([(q.get("dev", ""), q["kind"], q.get("handle", "")) for q in qdiscs
                                if q["kind"] in ("tbf", "htb", "netem", "clsact", "ingress")] +
                               [("ifb", link["ifname"], "") for link in links
                                if link.get("linkinfo", {}).get("info_kind") == "ifb"])
        return out

    def node_conditions(self) -> dict[str, dict[str, str]]:
        nodes = self.api("api/v1/nodes") or {"items": []}
        return {n["metadata"]["name"]: {c["type"]: c["status"] for c in n["status"].get("conditions", [])}
                for n in nodes["items"]}

    def _wait_ready(self) -> None:
        def ready() -> bool:
            conditions = self.node_conditions()
            return all(conditions.get(n, {}).get("Ready") == "True" for n in self.nodes)

        self._wait("every node Ready", ready, tuple(name for name, _ in self.procs))

    # -- teardown ----------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the kubelets, containerds and control plane (politely, newest first), then remove everything
        the cluster made (:func:`_tear_down`). Raises if anything stayed."""
        for _, proc in reversed(self.procs):
            _terminate(proc)
        _tear_down(self.tag, self.home)
        left = leftovers(self.tag)
        if left:
            raise RuntimeError(f"the test cluster left {left} behind")


def _terminate(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _processes_in(cgroups: list[Path]) -> list[int]:
    pids = []
    for root in cgroups:
        for procs in root.rglob("cgroup.procs") if root.exists() else []:
            try:
                pids += [int(p) for p in procs.read_text().split()]
            except OSError:
                pass
    return pids


def _remove_cgroup_tree(root: Path) -> None:
    """Leaf first: a v1 cgroup is removed with rmdir once it has no children and no processes."""
    if not root.exists():
        return
    for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir()
        except OSError:
            pass
    try:
        root.rmdir()
    except OSError:
        pass


KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")


def machine_sysctls() -> dict[str, str]:
    """The machine's values of the sysctls a kubelet sets (it sees its node's own files instead)."""
    return {path: Path("/proc/sys", path).read_text().strip() for path in KUBELET_SYSCTLS}


def _cgroups_of(tag: str) -> list[Path]:
    return [p for h in CGROUP_ROOT.iterdir() if h.is_dir() for p in h.glob(f"{tag}-*")]


def _tear_down(tag: str, home: Path) -> None:
    """Everything of the cluster `tag` (vnbtest-k8s-<pid>) with the directory `home`, whether its session
    stopped it or was killed: the processes that name the directory (etcd, apiserver, kubelets, containerds
    and their shims, which outlive containerd) or sit in its cgroups (the pods'), mounts under the directory,
    namespaces, cgroups leaf first (the kubelet makes its own in every hierarchy, unified included), the
    directory. The nodes' mount namespaces go with their last process."""
    for _ in range(10):
        pids = set(processes_naming(home)) | set(_processes_in(_cgroups_of(tag)))
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.3)
    unmount_under(home)
    for ns in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        if ns.startswith(f"{tag}-"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for cgroup in _cgroups_of(tag):
        _remove_cgroup_tree(cgroup)
    shutil.rmtree(home, ignore_errors=True)


def _homes(tag: str) -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"{tag}-*"))


def leftovers(tag: str = NETNS_PREFIX) -> list[str]:
    """What a cluster whose names start with `tag` left: namespaces, cgroups, processes, its directory."""
    left = [f"netns {n}" for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
            if n.startswith(tag)]
    left += [f"cgroup {p}" for h in CGROUP_ROOT.iterdir() if h.is_dir() for p in h.glob(f"{tag}*")]
    left += [f"directory {d}" for d in Path(tempfile.gettempdir()).glob(f"{tag}*")]
    left += [f"process {pid}" for d in Path(tempfile.gettempdir()).glob(f"{tag}*") for pid in processes_naming(d)]
    return left


def remove_dead_ones() -> list[str]:
    """Remove what the clusters of test sessions that are gone (killed) left; say which."""
    names = {n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])}
    names |= {p.name for h in CGROUP_ROOT.iterdir() if h.is_dir() for p in h.iterdir()}
    names |= {d.name for d in Path(tempfile.gettempdir()).iterdir()}
    pids = {n[len(NETNS_PREFIX):].partition("-")[0] for n in names if n.startswith(NETNS_PREFIX)}
    removed = []
    for pid in sorted(p for p in pids if p.isdigit() and not os.path.exists(f"/proc/{p}")):
        tag = f"{NETNS_PREFIX}{pid}"
        for home in _homes(tag) or [Path(tempfile.gettempdir()) / f"{tag}-gone"]:
            _tear_down(tag, home)
        removed.append(tag)
    return removed


@contextmanager
def cluster(nodes: int = 2, backend: str = "vxlan") -> Iterator[KubeCluster]:
    why = missing()
    if why:
        raise RuntimeError(why)
    remove_dead_ones()
    home = Path(tempfile.mkdtemp(prefix=f"{NETNS_PREFIX}{os.getpid()}-"))  # the tag: found by a later session
    c = KubeCluster(home, nodes, backend)
    try:
        c.start()
        yield c
    finally:
        c.stop()
