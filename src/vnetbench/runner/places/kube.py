"""A Kubernetes cluster (`--kube`): the endpoints are pods on the nodes the scenario's ``[kube]`` table names
(vnetbench/kube/bench.py says how a run uses them).

Preparing reads the kubeconfig, checks the placement against the scenario, and checks the cluster before
anything is made there: the nodes exist and are Ready, and each has the pods' image when it is never pulled.
Facts are each node's (kernel, OS, container runtime, kubelet) and the API server's version. Cleaning
deletes the namespaces vnetbench made (by label) whose run is not live on this machine.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from rich.markup import escape

from vnetbench.errors import EnvironmentProblem, VnetbenchError
from vnetbench.kube import api, bench as kube_bench, pods
from vnetbench.kube.image import tools_image_name
from vnetbench.runner.places.base import Place
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


class KubePlace(Place):
    """The cluster a kubeconfig and context name."""

    name = "kube"

    def __init__(self, kubeconfig: str | None, context: str | None):
        self.kubeconfig, self.context = kubeconfig, context
        self.cluster: api.Cluster | None = None
        self.plan: kube_bench.KubePlan | None = None
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
            "clean": "clean a Kubernetes cluster instead of this machine: the namespaces of killed runs (by label)",
        }[command]
        parser.add_argument("--kube", action="store_true", help=help_text)
        parser.add_argument("--kubeconfig", metavar="FILE", help="with --kube: this kubeconfig (default: $KUBECONFIG, "
                            "then ~/.kube/config)")
        parser.add_argument("--context", metavar="NAME", help="with --kube: this context of the kubeconfig "
                            "(default: its current one)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "KubePlace | None":
        if not getattr(args, "kube", False):
            if getattr(args, "kubeconfig", None) or getattr(args, "context", None):
                raise VnetbenchError("--kubeconfig and --context go with --kube")
            return None
        return cls(args.kubeconfig, args.context)

    def connect(self) -> api.Cluster:
        if self.cluster is None:
            self.cluster = api.connect(self.kubeconfig, self.context)
        return self.cluster

    def survey(self) -> None:
        """The nodes as the API reports them, and the server's version; EnvironmentProblem when unreachable."""
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
        spec = configs[0].scenario.kube
        default_image = tools_image_name() if spec is not None and spec.image is None else ""
        self.plan = plan = kube_bench.placement(configs, loaded.source, default_image)
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
        return configs, []

    def facts(self) -> dict[str, Any]:
        plan = self.plan
        used = plan.nodes() if plan else list(self.nodes)
        networks = list(dict.fromkeys(p.network for p in plan.placements.values())) if plan else []
        # each node's devices, once the run's bench has read them (netfacts)
        devices = self._bench.node_facts if self._bench is not None else {}
        return {"kube": {"server": self.cluster.server if self.cluster else None, "version": self.server_version,
                         "context": self.context, "network": ", ".join(networks) or None,
                         "image": plan.image if plan else None,
                         "pod_security": plan.pod_security if plan else None,
                         "nodes": {n: {**{k: v for k, v in self.nodes.get(n, {}).items() if k != "images"},
                                       **devices.get(n, {})} for n in used}}}

    def check_resume(self, fingerprint: dict[str, Any], run_id: str) -> None:
        if not fingerprint.get("kube"):
            raise VnetbenchError(f"run {run_id} did not run on Kubernetes: resume it without --kube")

    def bench(self, run_prefix: str, configs: list[Configuration]) -> kube_bench.KubeBench:
        self._bench = kube_bench.KubeBench.for_cluster(run_prefix, configs, self.connect(), self.plan)
        return self._bench

    def doctor(self, args: argparse.Namespace) -> int:
        """The cluster's nodes: Ready, kernel, runtime, and whether each has vnetbench's tools image."""
        from vnetbench.cli_common import out

        self.survey()
        image = tools_image_name()
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
        return 1 if lacking or not self.nodes else 0

    def clean(self, args: argparse.Namespace) -> int:
        """The namespaces vnetbench made whose run is not live here, deleted (by label: nothing else is
        looked at); --check and --dry-run only say what is there."""
        from vnetbench import runlock
        from vnetbench.cli_common import out
        from vnetbench.lab.netns import run_prefix

        if getattr(args, "run", None) or getattr(args, "images", False):
            raise VnetbenchError("--run and --images are for this machine's leftovers; `clean --kube` cleans every "
                                 "killed run's namespaces on the cluster")
        cluster = self.connect()
        live = {run_prefix(r.run_id) for r in runlock.live_runs()}
        found = [(ns, run) for ns, run in pods.namespaces_of_runs(cluster) if run not in live]
        verb = "left behind" if args.check else "would remove" if args.dry_run else "removed"
        for ns, _ in found:
            if not (args.check or args.dry_run):
                pods.delete_namespace(cluster, ns)
            out.print(f"{escape(cluster.server)}: {verb} namespace {escape(ns)}", soft_wrap=True)
        if not found:
            out.print(f"nothing of vnetbench's is left on {escape(cluster.where())}", soft_wrap=True)
        return 1 if args.check and found else 0

    def resume_args(self) -> str:
        return " --kube" + (f" --kubeconfig {shlex.quote(self.kubeconfig)}" if self.kubeconfig else "") + \
            (f" --context {shlex.quote(self.context)}" if self.context else "")

    def clean_command(self) -> str:
        return "vnetbench clean" + self.resume_args()
