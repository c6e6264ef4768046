"""One vnetbench run measures on a cluster at a time: two runs' pods would share the nodes and the network,
and each would measure the other's traffic (the lab's runlock.py and the hosts' hosts/lock.py, for clusters).

The lock is a Lease (``coordination.k8s.io/v1``, the object Kubernetes' own leader election uses) named
:data:`LEASE_NAME`: in the namespace ``default`` for runs in namespaces of their own, in the user's namespace
for runs there (``--namespace``; a user of one namespace may not write ``default``, so such runs exclude the
runs that use the same namespace, which the docs say). Taking it is an atomic create; a Lease that is there is
held until ``renewTime + leaseDurationSeconds``. The run renews it every :data:`RENEW_S` seconds from a thread
of its own, so a killed run's hold lapses :data:`DURATION_S` seconds after its last renewal and the next run
takes it over (an update with the Lease's resourceVersion: of two runs taking over one lapsed Lease, one wins).
Times are this machine's clock against the holder's: controllers whose clocks differ by a good part of
:data:`DURATION_S` would misjudge a lapse.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from vnetbench.errors import EnvironmentProblem
from vnetbench.kube.api import MANAGED_BY, RUN_LABEL, Cluster

LEASE_NAME = "vnetbench-lock"
DEFAULT_NAMESPACE = "default"
DURATION_S = 60
RENEW_S = 10
# what taking, renewing and letting go of it asks of the API, in its namespace (an access review's terms)
NEEDS = [(verb, "leases", "coordination.k8s.io") for verb in ("create", "get", "update", "delete")]


CONTROLLER_LABEL = "vnetbench.io/controller"  # the machine the run's vnetbench ran on (its host name)


def controller() -> str:
    """This machine's host name as a label value (at most 63 of [A-Za-z0-9._-], alphanumeric at both ends)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:63].strip("._-") or "unknown"


def lock_namespace(user_namespace: str | None) -> str:
    return user_namespace or DEFAULT_NAMESPACE


def holder_identity(run_prefix: str, scenario: str) -> str:
    """Who holds it, as the run that finds it taken is told: the run, its scenario, the controller and pid."""
    return f"{run_prefix} ({scenario}) on {socket.gethostname()} pid {os.getpid()}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def micro_time(t: dt.datetime) -> str:
    """As the API's MicroTime is written: RFC 3339, UTC, always six digits of fraction."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lapsed(lease: Any, now: dt.datetime | None = None) -> bool:
    """Whether a Lease's hold has run out (its holder stopped renewing it)."""
    spec = lease.spec
    renewed = spec.renew_time or spec.acquire_time
    if renewed is None or not spec.holder_identity:
        return True
    return (now or _now()) > renewed + dt.timedelta(seconds=spec.lease_duration_seconds or DURATION_S)


def describe(lease: Any, now: dt.datetime | None = None) -> str:
    spec = lease.spec
    renewed = spec.renew_time or spec.acquire_time
    age = f", renewed {((now or _now()) - renewed).total_seconds():.0f} s ago" if renewed else ""
    since = f" since {spec.acquire_time:%Y-%m-%d %H:%M:%S} UTC" if spec.acquire_time else ""
    return f"{spec.holder_identity}{since}{age}"


@dataclass
class ClusterLock:
    """The run's hold on the cluster: taken by :meth:`acquire`, renewed until :meth:`release`."""

    cluster: Cluster
    namespace: str
    run_prefix: str
    holder: str
    lost: str | None = None  # why a renewal failed, when one did (another run took the lapsed hold)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _version: str | None = None
    _acquired: dt.datetime = field(default_factory=_now)

    @property
    def coordination(self) -> Any:
        from kubernetes import client

        return client.CoordinationV1Api(self.cluster.client)

    def _body(self, now: dt.datetime, acquired: dt.datetime, version: str | None = None) -> dict[str, Any]:
        from vnetbench.kube.pods import run_labels

        meta: dict[str, Any] = {"name": LEASE_NAME,
                                "labels": {**run_labels(self.run_prefix), CONTROLLER_LABEL: controller()}}
        if version is not None:
            meta["resourceVersion"] = version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.holder, "leaseDurationSeconds": DURATION_S,
                         "acquireTime": micro_time(acquired), "renewTime": micro_time(now)}}

    def acquire(self) -> "ClusterLock":
        """Take the hold, or raise EnvironmentProblem naming who has it and until when."""
        from kubernetes.client.exceptions import ApiException

        from vnetbench.kube.pods import reason

        now = _now()
        where = f"{self.cluster.where()}: Lease {self.namespace}/{LEASE_NAME}"
        try:
            made = self.coordination.create_namespaced_lease(self.namespace, self._body(now, now))
        except ApiException as e:
            if e.status != 409:
                raise EnvironmentProblem(f"{where}: cannot take the cluster's lock: {reason(e)}: the user needs "
                                         f"create, get, update and delete on leases (coordination.k8s.io) in "
                                         f"namespace {self.namespace}") from None
            held = self.coordination.read_namespaced_lease(LEASE_NAME, self.namespace)
            if not lapsed(held, now):
                raise EnvironmentProblem(
                    f"another vnetbench run measures on this cluster ({describe(held, now)}), and two runs would "
                    f"measure each other's traffic: wait for it to end ({where}; a killed run's hold lapses "
                    f"{held.spec.lease_duration_seconds or DURATION_S} s after its last renewal)") from None
            try:  # lapsed: taken over, unless another run took it over first (the version moved on)
                made = self.coordination.replace_namespaced_lease(
                    LEASE_NAME, self.namespace, self._body(now, now, held.metadata.resource_version))
            except ApiException as e2:
                if e2.status == 409:
                    raise EnvironmentProblem(f"another vnetbench run took over the cluster's lapsed lock just now "
                                             f"({where}): wait for it to end") from None
                raise EnvironmentProblem(f"{where}: cannot take over the lapsed lock: {reason(e2)}") from None
        self._version = made.metadata.resource_version
        self._acquired = now
        self._thread = threading.Thread(target=self._renew, name="vnetbench-kube-lock", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                made = self.coordination.replace_namespaced_lease(
                    LEASE_NAME, self.namespace, self._body(_now(), self._acquired, self._version))
                self._version = made.metadata.resource_version
            except Exception as e:  # noqa: BLE001 - the API's and the network's errors alike: said at release
                status = getattr(e, "status", None)
                if status == 409:  # another run took the hold over: this run no longer excludes others
                    self.lost = "another run took over the cluster's lock while this one ran (it was not renewed " \
                                f"for {DURATION_S} s)"
                    return
                # a passing API error: the next renewal tries again, well within the lease's duration

    def release(self) -> None:
        """Stop renewing and delete the Lease, if it is still this run's (never another's: the delete's precondition
        is the version this run last wrote). Never raises: a Lease left behind lapses by itself."""
        from kubernetes import client

        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.lost:
            return
        try:
            self.coordination.delete_namespaced_lease(
                LEASE_NAME, self.namespace,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=self._version)))
        except Exception:  # noqa: BLE001 - gone, another's by now (409), or the API away: the hold lapses anyway
            pass


def leftover_leases(cluster: Cluster, namespace: str, live: set[str]) -> list[tuple[str, str]]:
    """The lock, when a killed run left it: a run of this machine's that is not live, or any run whose hold has
    lapsed (another controller's live run renews its own): [(namespace, its run)]."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        lease = client.CoordinationV1Api(cluster.client).read_namespaced_lease(LEASE_NAME, namespace)
    except ApiException:
        return []  # none, or not ours to read
    labels = lease.metadata.labels or {}
    run = labels.get(RUN_LABEL, "")
    ours = labels.get(MANAGED_BY[0]) == MANAGED_BY[1]
    mine = labels.get(CONTROLLER_LABEL) == controller()
    return [(namespace, run)] if ours and run and run not in live and (mine or lapsed(lease)) else []


def delete_lease(cluster: Cluster, namespace: str) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoordinationV1Api(cluster.client).delete_namespaced_lease(LEASE_NAME, namespace)
    except ApiException as e:
        if e.status != 404:
            raise
