"""A Kubernetes cluster (`--kube`): the endpoints are pods on the nodes the scenario's ``[kube]`` table names
(vnetbench/kube/bench.py says how a run uses them).

Preparing reads the kubeconfig, checks the placement against the scenario, and checks the cluster before
anything is made there: the nodes exist and are Ready, each has the pods' image when it is never pulled,
the namespace the user named (``--namespace``) exists, and the user may do what the run will do (an access
review). Holding the place is the cluster's lock (:mod:`vnetbench.kube.lock`: one run measures there at a
time). Facts are each node's (kernel, OS, container runtime, kubelet), the API server's version and the
namespace. Cleaning deletes what vnetbench made (by label) whose run is not live on this machine: its own
namespaces, its pods and Services in namespaces it did not make, and the lock a killed run left (at once
when the run was this machine's, else once its hold has lapsed).
"""

from __future__ import annotations

import argparse
import re
import shlex
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from vnetbench.errors import EnvironmentProblem, VnetbenchError
from vnetbench.runner.places.base import Place

# The cluster's client is imported where it is used: every command builds its parser from the places
# (runner/places/lab.py).
if TYPE_CHECKING:
    from vnetbench.kube import api, bench as kube_bench, lock as kube_lock
    from vnetbench.kube import image as kube_image
    from vnetbench.scenario.load import LoadedScenario
    from vnetbench.scenario.plan import Configuration


def node_facts(node: Any) -> dict[str, Any]:
    info = node.status.node_info
    ready = next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "Unknown")
    return {"ready": ready == "True", "kernel": info.kernel_version, "os": info.os_image,
            "container_runtime": info.container_runtime_version, "kubelet": info.kubelet_version,
            "cpu": (node.status.allocatable or {}).get("cpu"), "memory": (node.status.allocatable or {}).get("memory"),
            "addresses": {a.type: a.address for a in node.status.addresses or []}}


def node_images(node: Any) -> set[str]:
    return {name for image in node.status.images or [] for name in image.names or []}


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class KubePlace(Place):
    """The cluster a kubeconfig and context name."""

    name = "kube"

    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str | None = None):
        self.kubeconfig, self.context, self.namespace = kubeconfig, context, namespace
        self.namespace_facts: dict[str, Any] = {}
        self.lock: kube_lock.ClusterLock | None = None
        self.cluster: api.Cluster | None = None
        self.plan: kube_bench.KubePlan | None = None
        self.pushed: kube_image.Pushed | None = None  # the tools image pushed to kube.registry by prepare
        self._bench: kube_bench.KubeBench | None = None
        self.nodes: dict[str, dict[str, Any]] = {}
        self.server_version: str | None = None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, command: str) -> None:
        help_text = {
            "run": "run the endpoints as pods of a Kubernetes cluster, on the nodes the scenario's [kube] table names, "
                   "instead of in the local lab",
            "doctor": "check a Kubernetes cluster instead of this machine: its nodes, and whether each has the "
                      "tools image; nothing is made there",
            "clean": "clean a Kubernetes cluster instead of this machine: the namespaces of killed runs, and their "
                     "pods and Services in namespaces vnetbench did not make (by label)",
        }[command]
        parser.add_argument("--kube", action="store_true", help=help_text)
        parser.add_argument("--kubeconfig", metavar="FILE", help="with --kube: this kubeconfig (default: $KUBECONFIG, "
                            "then ~/.kube/config)")
        parser.add_argument("--context", metavar="NAME", help="with --kube: this context of the kubeconfig "
                            "(default: its current one)")
        parser.add_argument("--namespace", metavar="NAME", help={
            "run": "with --kube: make the run's pods in this existing namespace (for users who may not make "
                   "namespaces; default: a namespace of the run's own, made and deleted by it)",
            "doctor": "with --kube: check what a run may do in this namespace",
            "clean": "with --kube: clean what runs left in this namespace alone (default: vnetbench's namespaces, "
                     "and its pods and Services in every namespace the user may list)"}[command])

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "KubePlace | None":
        if not getattr(args, "kube", False):
            if getattr(args, "kubeconfig", None) or getattr(args, "context", None) or getattr(args, "namespace", None):
                raise VnetbenchError("--kubeconfig, --context and --namespace go with --kube")
            return None
        namespace = getattr(args, "namespace", None)
        if namespace is not None and not DNS_LABEL.fullmatch(namespace):
            raise VnetbenchError(f"--namespace {namespace!r}: a namespace's name is a DNS label (at most 63 "
                                 "lower-case letters, digits and '-', starting and ending with a letter or digit)")
        return cls(args.kubeconfig, args.context, namespace)

    def connect(self) -> api.Cluster:
        from vnetbench.kube import api

        if self.cluster is None:
            self.cluster = api.connect(self.kubeconfig, self.context)
        return self.cluster

    def survey(self) -> None:
        """The nodes as the API reports them, and the server's version; EnvironmentProblem when unreachable."""
        from vnetbench.kube import api

        cluster = self.connect()
        try:
            self.nodes = {n.metadata.name: {**node_facts(n), "images": node_images(n)}
                          for n in cluster.core.list_node(_request_timeout=api.API_TIMEOUT_S).items}
            from kubernetes import client

            self.server_version = client.VersionApi(cluster.client).get_code(
                _request_timeout=api.API_TIMEOUT_S).git_version
        except Exception as e:  # noqa: BLE001 - urllib3's and the API's errors alike: the cluster is not usable
            raise EnvironmentProblem(f"{cluster.where()}: the API does not answer: {e}") from None

    def prepare(self, loaded: LoadedScenario, configs: list[Configuration]
                ) -> tuple[list[Configuration], list[dict[str, object]]]:
        from vnetbench.kube import bench as kube_bench, image as kube_image

        spec = configs[0].scenario.kube
        default_image = "" if spec is None or spec.image else (
            kube_image.pushed_name(spec.registry) if spec.registry else kube_image.tools_image_name())
        self.plan = plan = kube_bench.placement(configs, loaded.source, default_image, self.namespace)
        self.survey()
        problems = [f"node {node!r} is not in the cluster (nodes: {', '.join(self.nodes) or 'none'})"
                    for node in plan.nodes() if node not in self.nodes]
        if not problems:
            problems = plan.resolve([n for n, f in self.nodes.items() if f["ready"]])
        for node in plan.nodes() if not problems else []:
            facts = self.nodes[node]
            if not facts["ready"]:
                problems.append(f"node {node!r} is not Ready")
            elif plan.pull_policy == "Never" and plan.image not in facts["images"]:
                problems.append(f"node {node!r} does not have the image {plan.image} and kube.image_pull_policy "
                                "is Never: load it there (`vnetbench image --oci FILE` writes vnetbench's; "
                                "`ctr -n k8s.io images import FILE` on the node), or name an image the node can pull "
                                "in kube.image with kube.image_pull_policy = \"IfNotPresent\"")
        if problems:
            raise EnvironmentProblem(f"{loaded.source}: on {self.cluster.where()}: " + "; ".join(problems))
        self._check_namespace(plan)
        if spec is not None and spec.registry:
            # Last, once the cluster can run the pods: what the nodes will pull, and its digest in the registry.
            self.pushed = kube_image.push(spec.registry, spec.registry_tls_verify)
        return configs, []

    def _refused(self, needs: list[tuple[str, str, str]]) -> list[str]:
        """What a run needs of the API (`needs`, and the cluster's lock) that this user is refused."""
        from vnetbench.kube import lock as kube_lock, pods

        cluster, lock_ns = self.connect(), kube_lock.lock_namespace(self.namespace)
        lock = pods.denied(cluster, lock_ns, kube_lock.NEEDS)
        return [*pods.denied(cluster, self.namespace, needs),
                *([f"{'; '.join(lock)} in namespace {lock_ns} (the cluster's lock)"] if lock else [])]

    def _check_namespace(self, plan: kube_bench.KubePlan) -> None:
        """The namespace the user named exists; the user may do in it (or, without one, on the cluster) what the
        run will do: else EnvironmentProblem naming what is refused and what to do, before anything is made."""
        from vnetbench.kube import pods

        cluster = self.connect()
        if self.namespace is None:
            self.namespace_facts = {"name": "the run's own (its prefix)", "made_by_run": True}
        else:
            self.namespace_facts = pods.check_namespace(cluster, self.namespace)
        refused = self._refused(plan.needs())
        if not refused:
            return
        where = f"in namespace {self.namespace}" if self.namespace else "on the cluster"
        fix = ("ask for a Role there that allows them" if self.namespace else
               "name a namespace you may make pods in with --namespace NAME, or ask for the rights")
        raise EnvironmentProblem(f"{cluster.where()}: this user {'; '.join(refused)} {where}, which the run needs: "
                                 f"{fix}")

    def hold(self, run_id: str, scenario: str) -> None:
        from vnetbench.kube import lock as kube_lock
        from vnetbench.lab.netns import run_prefix

        prefix = run_prefix(run_id)
        self.lock = kube_lock.ClusterLock(self.connect(), kube_lock.lock_namespace(self.namespace), prefix,
                                          kube_lock.holder_identity(prefix, scenario)).acquire()

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def facts(self) -> dict[str, Any]:
        plan = self.plan
        used = plan.nodes() if plan else list(self.nodes)
        networks = list(dict.fromkeys(p.network for p in plan.placements.values())) if plan else []
        # each node's devices, once the run's bench has read them (netfacts)
        devices = self._bench.node_facts if self._bench is not None else {}
        return {"kube": {"server": self.cluster.server if self.cluster else None, "version": self.server_version,
                         "context": self.context, "network": ", ".join(networks) or None,
                         "image": plan.image if plan else None,
                         **({"image_pushed": {"digest": self.pushed.digest, "pull_policy": plan.pull_policy}}
                            if self.pushed and plan else {}),
                         "pod_security": plan.pod_security if plan else None,
                         "namespace": self.namespace_facts or None,
                         "nodes": {n: {**{k: v for k, v in self.nodes.get(n, {}).items() if k != "images"},
                                       **devices.get(n, {})} for n in used}}}

    def check_resume(self, fingerprint: dict[str, Any], run_id: str) -> None:
        if not fingerprint.get("kube"):
            raise VnetbenchError(f"run {run_id} did not run on Kubernetes: resume it without --kube")

    def bench(self, run_prefix: str, configs: list[Configuration]) -> kube_bench.KubeBench:
        from vnetbench.kube import bench as kube_bench

        self._bench = kube_bench.KubeBench.for_cluster(run_prefix, configs, self.connect(), self.plan)
        return self._bench

    def doctor(self, args: argparse.Namespace) -> int:
        """The cluster's nodes: Ready, kernel, runtime, and whether each has vnetbench's tools image."""
        from vnetbench.cli_common import out
        from vnetbench.kube import image as kube_image

        self.survey()
        image = kube_image.tools_image_name()
        out.print(f"cluster {escape(self.cluster.where())}: Kubernetes {escape(str(self.server_version))}")
        lacking = []
        for name, facts in self.nodes.items():
            has = image in facts["images"]
            mark = "[green]ok[/]  " if facts["ready"] and has else "[red]no[/]  "
            out.print(f"{mark}{escape(name):20} {'Ready' if facts['ready'] else 'not Ready'}, kernel "
                      f"{escape(str(facts['kernel']))}, {escape(str(facts['container_runtime']))}, "
                      f"{'has' if has else 'lacks'} {escape(image)}", soft_wrap=True)
            if not (facts["ready"] and has):
                lacking.append(name)
        if lacking:
            out.print(f"[dim]->[/] load the tools image on {escape(', '.join(lacking))} (`vnetbench image --oci FILE` "
                      "writes it; `ctr -n k8s.io images import FILE` on each node), or give kube.image an image the "
                      "nodes can pull", soft_wrap=True)
        refused = self._doctor_rights(out)
        self._doctor_lock(out)
        return 1 if lacking or refused or not self.nodes else 0

    def _doctor_lock(self, out: Any) -> None:
        """Who holds the cluster's lock, if anyone: a run would wait for it."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from vnetbench.kube import lock as kube_lock, pods

        namespace = kube_lock.lock_namespace(self.namespace)
        try:
            lease = client.CoordinationV1Api(self.connect().client).read_namespaced_lease(kube_lock.LEASE_NAME,
                                                                                          namespace)
        except ApiException as e:
            out.print(f"[green]ok[/]  the cluster's lock (Lease {escape(namespace)}/{kube_lock.LEASE_NAME}) is free"
                      if e.status == 404 else f"[yellow]?[/]   the cluster's lock cannot be read: "
                      f"{escape(pods.reason(e))}", soft_wrap=True)
            return
        state = "lapsed, a run takes it over" if kube_lock.lapsed(lease) else "held"
        out.print(f"[yellow]--[/]  the cluster's lock is {state}: {escape(kube_lock.describe(lease))}", soft_wrap=True)

    def _doctor_rights(self, out: Any) -> list[str]:
        """What a run needs of the API that this user is refused (access reviews), printed; a namespace the user
        named must exist."""
        from vnetbench.kube import bench as kube_bench, pods

        cluster = self.connect()
        if self.namespace is not None:
            try:
                pods.check_namespace(cluster, self.namespace)
            except EnvironmentProblem as e:
                out.print(f"[red]no[/]  {escape(str(e))}", soft_wrap=True)
                return [str(e)]
        # every path a run may take: Services and their EndpointSlices too
        refused = self._refused(kube_bench.api_needs(self.namespace, services=True))
        where = f"in namespace {self.namespace}" if self.namespace else "a namespace of each run's own"
        if refused:
            out.print(f"[red]no[/]  runs {escape(where)}: this user {escape('; '.join(refused))}", soft_wrap=True)
            if self.namespace is None:
                out.print("[dim]->[/] name a namespace you may make pods in with --namespace NAME", soft_wrap=True)
        else:
            out.print(f"[green]ok[/]  runs {escape(where)}: this user may make, exec into and delete pods and "
                      f"Services{' and namespaces' if self.namespace is None else ''}", soft_wrap=True)
        return refused

    def clean(self, args: argparse.Namespace) -> int:
        """What vnetbench made whose run is not live here, deleted (by label: nothing else is looked at): its
        own namespaces, whole, its pods and Services in namespaces it did not make, and the cluster's lock a
        killed run left; with --namespace, in that namespace alone. --check and --dry-run only say what is
        there."""
        from vnetbench.kube import lock as kube_lock, pods
        from vnetbench import runlock
        from vnetbench.cli_common import out
        from vnetbench.lab.netns import run_prefix

        if getattr(args, "run", None) or getattr(args, "images", False):
            raise VnetbenchError("--run and --images are for this machine's leftovers; `clean --kube` cleans every "
                                 "killed run's namespaces on the cluster")
        from kubernetes.client.exceptions import ApiException

        cluster = self.connect()
        live = {run_prefix(r.run_id) for r in runlock.live_runs()}
        verb = "left behind" if args.check else "would remove" if args.dry_run else "removed"
        act = not (args.check or args.dry_run)
        namespaces: list[tuple[str, str]] = []  # with --namespace, that namespace alone is looked at
        try:
            if self.namespace is None:
                namespaces = [(ns, run) for ns, run in pods.namespaces_of_runs(cluster) if run not in live]
        except ApiException as e:
            raise VnetbenchError(f"{cluster.where()}: listing namespaces: {pods.reason(e)}: clean what runs left in "
                                 "a namespace you may use with --namespace NAME") from None
        for ns, _ in namespaces:
            if act:
                pods.delete_namespace(cluster, ns)
            out.print(f"{escape(cluster.server)}: {verb} namespace {escape(ns)}", soft_wrap=True)
        leases = kube_lock.leftover_leases(cluster, kube_lock.lock_namespace(self.namespace), live)
        for ns, run in leases:
            if act:
                kube_lock.delete_lease(cluster, ns)
            out.print(f"{escape(cluster.server)}: {verb} the lock Lease {escape(ns)}/{kube_lock.LEASE_NAME} "
                      f"(run {escape(run)})", soft_wrap=True)
        objects, unlisted = pods.objects_of_runs(cluster, self.namespace)
        objects = [o for o in objects if o[3] not in live]
        for ns, run in sorted({(o[0], o[3]) for o in objects}):
            if act:
                pods.delete_run_objects(cluster, ns, run)
            for kind, name in sorted((o[1], o[2]) for o in objects if (o[0], o[3]) == (ns, run)):
                out.print(f"{escape(cluster.server)}: {verb} {kind} {escape(ns)}/{escape(name)} (run {escape(run)})",
                          soft_wrap=True)
        if unlisted:
            out.print(f"[dim]->[/] vnetbench's pods and Services outside its own namespaces cannot be listed in every "
                      f"namespace ({escape(unlisted)}): name one with --namespace NAME", soft_wrap=True)
        if not namespaces and not objects and not leases:
            out.print(f"nothing of vnetbench's is left on {escape(cluster.where())}"
                      f"{' in namespace ' + escape(self.namespace) if self.namespace else ''}", soft_wrap=True)
        return 1 if args.check and (namespaces or objects or leases) else 0

    def resume_args(self) -> str:
        return " --kube" + (f" --kubeconfig {shlex.quote(self.kubeconfig)}" if self.kubeconfig else "") + \
            (f" --context {shlex.quote(self.context)}" if self.context else "") + \
            (f" --namespace {self.namespace}" if self.namespace else "")

    def clean_command(self) -> str:
        return "vnetbench clean" + self.resume_args()
