"""The connection to a cluster: a kubeconfig and a context, read by the official ``kubernetes`` client (every
way a kubeconfig authenticates: tokens, client certificates, exec plugins), and what the exec helper
(:mod:`vnetbench.kube.exec`) needs of it, written once per run to a file only root reads.

Every object vnetbench makes carries :data:`MANAGED_BY` and the run's prefix under :data:`RUN_LABEL`; cleanup
selects by them and never touches an object without them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vnetbench.errors import EnvironmentProblem

MANAGED_BY = ("app.kubernetes.io/managed-by", "vnetbench")
RUN_LABEL = "vnetbench.io/run"  # the run's prefix (vnb-<id>), as on the lab's namespaces and containers
API_TIMEOUT_S = 30


@dataclass
class Cluster:
    """A reachable cluster: the API client, its CoreV1Api, and which kubeconfig and context chose it."""

    client: Any  # kubernetes.client.ApiClient
    core: Any  # kubernetes.client.CoreV1Api
    kubeconfig: str | None
    context: str | None

    @property
    def server(self) -> str:
        return str(self.client.configuration.host)

    @property
    def discovery(self) -> Any:
        """The DiscoveryV1Api (EndpointSlices) on the same client."""
        from kubernetes import client

        return client.DiscoveryV1Api(self.client)

    def where(self) -> str:
        """The cluster as a person names it: its API server, kubeconfig and context."""
        return (f"{self.server} (kubeconfig {self.kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'}"
                f"{', context ' + self.context if self.context else ''})")


def connect(kubeconfig: str | None = None, context: str | None = None) -> Cluster:
    """The cluster a kubeconfig (default: $KUBECONFIG, then ~/.kube/config) and context name; raises
    EnvironmentProblem naming the file and what to do when it cannot be read."""
    from kubernetes import client, config

    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError, TypeError, ValueError) as e:
        raise EnvironmentProblem(
            f"kubeconfig {kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'}"
            f"{' context ' + context if context else ''}: {e}: give the cluster's with --kubeconfig FILE "
            "(and --context NAME)") from None
    return Cluster(api_client, client.CoreV1Api(api_client), kubeconfig, context)


def exec_credentials(cluster: Cluster) -> dict[str, Any]:
    """What opening an exec stream needs: the API server, the Authorization header (a token refreshed now,
    for kubeconfigs whose tokens expire), the server's CA or no verification (the kubeconfig's choice), and
    the client certificate and key files."""
    conf = cluster.client.configuration
    # As the client sets the header on its own requests (this runs the refresh hook of exec plugins too).
    authorization = conf.auth_settings().get("BearerToken", {}).get("value")
    return {"host": conf.host, "authorization": authorization or None, "verify": bool(conf.verify_ssl),
            "ca": conf.ssl_ca_cert, "cert": conf.cert_file, "key": conf.key_file,
            "server_name": getattr(conf, "tls_server_name", None)}


def write_credentials(cluster: Cluster, path: Path) -> Path:
    """exec_credentials in `path`, readable by its owner only (it holds the token)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(exec_credentials(cluster), f)
    return path
