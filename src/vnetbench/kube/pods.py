"""A run's objects in a cluster: a namespace of its own, named after the run's prefix, and in it one pod per
endpoint, every object labelled (:data:`vnetbench.kube.api.MANAGED_BY`, :data:`vnetbench.kube.api.RUN_LABEL`).
Or, for users who may not make namespaces, a namespace they name (``--namespace``): the run's pods and
Services are then named after the run (``vnb-<id>-r``), the namespace is neither made nor deleted, and only
the objects with the run's labels are removed (:func:`delete_run_objects`).

A pod's process is the tools image's idle entrypoint; servers and clients are exec'd into it
(:mod:`vnetbench.kube.exec`), so a trial can restart a server without rescheduling a pod. Pods are placed
by node name (``nodeName``: no scheduler involved, the placement the scenario asked for or an error) or by
node selector; ``hostNetwork`` puts a pod in its node's own network, for the baseline against the pod
network. The image is never pulled unless the user says so (``imagePullPolicy: Never`` by default: the image
is the one vnetbench built from this machine's files, loaded on the nodes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vnetbench.errors import EnvironmentProblem, LabError
from vnetbench.kube.api import MANAGED_BY, RUN_LABEL, Cluster

CONTAINER = "tools"
POD_LABEL = "vnetbench.io/pod"
# A pod in its own network sends ping's echoes by ICMP datagram sockets, which this namespaced sysctl opens to
# every group: no NET_RAW (kubelets accept the sysctl as safe, and Pod Security's baseline allows it). A pod in
# its node's network may set no network sysctl, and keeps NET_RAW.
PING_GROUPS = {"name": "net.ipv4.ping_group_range", "value": "0 2147483647"}
# The label by which a namespace asks the API server to enforce a Pod Security Standards level on its pods.
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
# Waiting reasons that no wait ends: the pod is refused with the reason at once.
HOPELESS = {"ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError",
            "ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "RunContainerError"}


def run_labels(run_prefix: str) -> dict[str, str]:
    return {MANAGED_BY[0]: MANAGED_BY[1], RUN_LABEL: run_prefix}


def selector(run_prefix: str | None = None) -> str:
    """The label selector of every object vnetbench made (of one run's, given its prefix)."""
    return f"{MANAGED_BY[0]}={MANAGED_BY[1]}" + (f",{RUN_LABEL}={run_prefix}" if run_prefix else "")


@dataclass
class PodSpec:
    """One endpoint's pod: where it runs and in which network."""

    name: str  # the endpoint's (r, s1, ..)
    image: str
    node: str | None = None  # nodeName
    node_selector: dict[str, str] = field(default_factory=dict)
    host_network: bool = False
    net_admin: bool = False  # NET_ADMIN on its own interfaces: tcp_metrics flushed, tc inside the pod
    pull_policy: str = "Never"
    object_prefix: str = ""  # before `name` in the pod's and its Service's names: the run's, in a shared namespace

    @property
    def object_name(self) -> str:
        """The pod's name (and its Service's) in the namespace."""
        return f"{self.object_prefix}{self.name}"

    @property
    def pod_security(self) -> str:
        """The Pod Security Standards level it needs: privileged for the node's network or NET_ADMIN (neither
        is in baseline's), else baseline."""
        return "privileged" if self.host_network or self.net_admin else "baseline"

    @property
    def labels(self) -> dict[str, str]:
        """Its own label: what a Service in front of it selects (the pod alone, not the run's others)."""
        return {POD_LABEL: self.object_name}

    def manifest(self, labels: dict[str, str]) -> dict[str, Any]:
        capabilities = [*(["NET_RAW"] if self.host_network else []), *(["NET_ADMIN"] if self.net_admin else [])]
        container: dict[str, Any] = {"name": CONTAINER, "image": self.image, "imagePullPolicy": self.pull_policy}
        if capabilities:
            container["securityContext"] = {"capabilities": {"add": capabilities}}
        spec: dict[str, Any] = {
            "automountServiceAccountToken": False, "enableServiceLinks": False, "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0, "hostNetwork": self.host_network, "containers": [container]}
        if self.host_network:
            spec["dnsPolicy"] = "ClusterFirstWithHostNet"
        else:
            spec["securityContext"] = {"sysctls": [dict(PING_GROUPS)]}
        if self.node:
            spec["nodeName"] = self.node
        if self.node_selector:
            spec["nodeSelector"] = dict(self.node_selector)
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": self.object_name, "labels": {**labels, **self.labels}},
                "spec": spec}


def create_service(cluster: Cluster, namespace: str, pod: PodSpec, ports: list[tuple[int, str]],
                   ip_version: int, labels: dict[str, str]) -> str:
    """A ClusterIP Service in front of `pod` alone, on these (port, protocol) pairs, of one IP family; its
    ClusterIP. Named after the pod; deleted with the run's objects."""
    from kubernetes.client.exceptions import ApiException

    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": pod.object_name, "labels": dict(labels)},
            "spec": {"type": "ClusterIP", "selector": pod.labels, "ipFamilies": [f"IPv{ip_version}"],
                     "ports": [{"name": f"{proto.lower()}-{port}", "port": port, "targetPort": port,
                                "protocol": proto} for port, proto in ports]}}
    try:
        made = cluster.core.create_namespaced_service(namespace, body)
    except ApiException as e:
        raise LabError(f"{cluster.where()}: creating Service {namespace}/{pod.object_name}: {reason(e)}") from None
    return str(made.spec.cluster_ip)


def wait_service_ready(cluster: Cluster, namespace: str, name: str, pod_ip: str, timeout_s: float = 60.0) -> None:
    """Until the Service's EndpointSlices hold the pod's address, ready: from then on the cluster's Service
    proxies are told to send to it (they program it within their sync period)."""
    deadline = time.monotonic() + timeout_s
    while True:
        slices = cluster.discovery.list_namespaced_endpoint_slice(
            namespace, label_selector=f"kubernetes.io/service-name={name}").items
        if any(pod_ip in (ep.addresses or []) and (ep.conditions is None or ep.conditions.ready is not False)
               for s in slices for ep in s.endpoints or []):
            return
        if time.monotonic() > deadline:
            raise LabError(f"{cluster.where()}: Service {namespace}/{name} has no ready endpoint at {pod_ip} after "
                           f"{timeout_s:.0f} s: the cluster's EndpointSlice controller is not running, or the pod is "
                           f"not ready\n{_events(cluster, namespace)}")
        time.sleep(0.3)


def create_namespace(cluster: Cluster, name: str, labels: dict[str, str]) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.core.create_namespace({"metadata": {"name": name, "labels": dict(labels)}})
    except ApiException as e:
        raise LabError(f"{cluster.where()}: creating namespace {name}: {reason(e)}") from None


def create_pods(cluster: Cluster, namespace: str, pods: list[PodSpec], labels: dict[str, str]) -> None:
    from kubernetes.client.exceptions import ApiException

    for pod in pods:
        try:
            cluster.core.create_namespaced_pod(namespace, pod.manifest(labels))
        except ApiException as e:
            raise LabError(f"{cluster.where()}: creating pod {namespace}/{pod.object_name}: {reason(e)}"
                           f"{_pod_security_fix(pod, str(e.body))}") from None


def _pod_security_fix(pod: PodSpec, body: str) -> str:
    """What to change when the cluster's Pod Security refused the pod (empty for any other refusal)."""
    if "violates PodSecurity" not in body:
        return ""
    if pod.host_network:
        return (". The pod is on its node's network (kube.network = \"host\"), which only the privileged level "
                "allows: run the pod network alone (kube.network = \"pod\", kube.pod_security = \"baseline\"), or "
                "where the cluster lets vnetbench's namespaces (vnb-*) run privileged pods")
    if pod.net_admin:
        return (". The pod asks for NET_ADMIN (to flush TCP's metrics before each trial), which only the "
                "privileged level allows: set kube.pod_security = \"baseline\" (no capability; TCP's metrics are "
                "then not flushed between trials), or run where the cluster lets vnetbench's namespaces (vnb-*) "
                "run privileged pods")
    return ""


def wait_running(cluster: Cluster, namespace: str, names: list[str], timeout_s: float = 120.0) -> dict[str, Any]:
    """Each pod once Running (its V1Pod); raises LabError with each pod's state and its last events when one
    cannot run (a waiting reason no wait ends) or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = {p.metadata.name: p for p in cluster.core.list_namespaced_pod(namespace).items if p.metadata.name in names}
        stuck = {n: _waiting(p) for n, p in pods.items() if _waiting(p) in HOPELESS or p.status.phase == "Failed"}
        if all(n in pods and pods[n].status.phase == "Running" for n in names):
            return pods
        if stuck or time.monotonic() > deadline:
            states = "; ".join(f"{n}: {pods[n].status.phase if n in pods else 'not made'}"
                               f"{' (' + _waiting(pods[n]) + ')' if n in pods and _waiting(pods[n]) else ''}"
                               for n in names)
            raise LabError(f"{cluster.where()}: pods in {namespace} not running"
                           f"{'' if stuck else f' after {timeout_s:.0f} s'}: {states}\n{_events(cluster, namespace)}")
        time.sleep(0.3)


def delete_namespace(cluster: Cluster, name: str, timeout_s: float = 120.0) -> None:
    """Delete the run's namespace (with its pods) and wait until it is gone."""
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.core.delete_namespace(name, grace_period_seconds=0, propagation_policy="Foreground")
    except ApiException as e:
        if e.status == 404:
            return
        raise LabError(f"{cluster.where()}: deleting namespace {name}: {reason(e)}") from None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            cluster.core.read_namespace(name)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        time.sleep(0.3)
    raise LabError(f"{cluster.where()}: namespace {name} still terminating after {timeout_s:.0f} s")


def delete_run_objects(cluster: Cluster, namespace: str, run_prefix: str, timeout_s: float = 120.0) -> None:
    """In a namespace that is not the run's own: the Services and pods with the run's labels, deleted, and
    waited for until the pods are gone (nothing else in the namespace is looked at)."""
    from kubernetes.client.exceptions import ApiException

    chosen = selector(run_prefix)
    try:
        for svc in cluster.core.list_namespaced_service(namespace, label_selector=chosen).items:
            _delete(lambda: cluster.core.delete_namespaced_service(svc.metadata.name, namespace))
        made = cluster.core.list_namespaced_pod(namespace, label_selector=chosen).items
        for pod in made:
            _delete(lambda: cluster.core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0))
        deadline = time.monotonic() + timeout_s
        while made and cluster.core.list_namespaced_pod(namespace, label_selector=chosen).items:
            if time.monotonic() > deadline:
                raise LabError(f"{cluster.where()}: the pods of run {run_prefix} in namespace {namespace} are still "
                               f"terminating after {timeout_s:.0f} s")
            time.sleep(0.3)
    except ApiException as e:
        raise LabError(f"{cluster.where()}: deleting run {run_prefix}'s pods and Services in namespace {namespace}: "
                       f"{reason(e)}") from None


def _delete(call: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as e:
        if e.status != 404:  # gone already is what was asked
            raise


def check_namespace(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """A namespace the user named: its labels (its Pod Security level among them) where the user may read it,
    or why not. Raises EnvironmentProblem when it does not exist (nothing is made in it then)."""
    from kubernetes.client.exceptions import ApiException

    try:
        labels = cluster.core.read_namespace(namespace, _request_timeout=30).metadata.labels or {}
    except ApiException as e:
        if e.status == 404:
            raise EnvironmentProblem(
                f"{cluster.where()}: namespace {namespace} (--namespace) does not exist: create it (`kubectl create "
                f"namespace {namespace}`), or leave --namespace out and the run makes a namespace of its own") from None
        if e.status == 403:  # a user of one namespace may not read the namespace object itself: fine
            return {"name": namespace, "made_by_run": False, "labels": f"not readable: {reason(e)}"}
        raise
    return {"name": namespace, "made_by_run": False,
            "labels": {k: v for k, v in labels.items() if k.startswith("pod-security.kubernetes.io/")}}


def denied(cluster: Cluster, namespace: str | None, wanted: list[tuple[str, str, str]]) -> list[str]:
    """Which of `wanted` (verb, resource, API group; a resource "pods/exec" is the exec subresource) the
    cluster's authorizer denies the user, in `namespace` (None: cluster-wide), each as "may not VERB
    RESOURCE" (SelfSubjectAccessReview, which every authenticated user may ask). Empty where the API cannot
    say (an authorizer without access reviews): the calls themselves then tell."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    auth = client.AuthorizationV1Api(cluster.client)
    refused = []
    for verb, resource, group in wanted:
        resource_name, _, sub = resource.partition("/")
        attributes = {"verb": verb, "resource": resource_name, "group": group,
                      **({"subresource": sub} if sub else {}), **({"namespace": namespace} if namespace else {})}
        try:
            review = auth.create_self_subject_access_review(
                {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                 "spec": {"resourceAttributes": attributes}}, _request_timeout=30)
        except ApiException:
            return []
        if not review.status.allowed:
            refused.append(f"may not {verb} {resource}{' (' + group + ')' if group else ''}")
    return refused


def objects_of_runs(cluster: Cluster, namespace: str | None) -> tuple[list[tuple[str, str, str, str]], str | None]:
    """Pods and Services with vnetbench's labels outside vnetbench's own namespaces: (namespace, kind, name,
    run prefix) each, in `namespace`, or in every namespace the user may list; and why none could be listed
    (None when they could)."""
    from kubernetes.client.exceptions import ApiException

    found: list[tuple[str, str, str, str]] = []
    try:
        listings = ([("pod", cluster.core.list_namespaced_pod(namespace, label_selector=selector())),
                     ("service", cluster.core.list_namespaced_service(namespace, label_selector=selector()))]
                    if namespace else
                    [("pod", cluster.core.list_pod_for_all_namespaces(label_selector=selector())),
                     ("service", cluster.core.list_service_for_all_namespaces(label_selector=selector()))])
    except ApiException as e:
        return [], reason(e)
    for kind, listing in listings:
        for item in listing.items:
            where = item.metadata.namespace
            run = (item.metadata.labels or {}).get(RUN_LABEL, "")
            if where != run:  # a run's own namespace goes whole, with the namespace
                found.append((where, kind, item.metadata.name, run))
    return found, None


def namespaces_of_runs(cluster: Cluster) -> list[tuple[str, str]]:
    """(namespace, run prefix) of every namespace vnetbench made there (by label: nothing else is ours)."""
    return [(n.metadata.name, (n.metadata.labels or {}).get(RUN_LABEL, ""))
            for n in cluster.core.list_namespace(label_selector=selector()).items]


def _waiting(pod: Any) -> str:
    for status in pod.status.container_statuses or []:
        if status.state and status.state.waiting and status.state.waiting.reason:
            return str(status.state.waiting.reason)
    return ""


def _events(cluster: Cluster, namespace: str, last: int = 8) -> str:
    try:
        events = cluster.core.list_namespaced_event(namespace).items
    except Exception:  # noqa: BLE001 - the events only explain; the error is raised anyway
        return ""
    events.sort(key=lambda e: str(e.last_timestamp or e.event_time or ""))
    return "\n".join(f"  {e.involved_object.name}: {e.reason}: {e.message}" for e in events[-last:])


def reason(e: Any) -> str:
    import json

    try:
        return f"HTTP {e.status}: {json.loads(e.body).get('message', e.reason)}"
    except (TypeError, ValueError):
        return f"HTTP {e.status}: {e.reason}"
