"""Kubernetes as a place to run (issue 34): endpoints are pods, commands reach them through the API's exec.

- :mod:`vnetbench.kube.api`: the connection (kubeconfig and context, by the official ``kubernetes`` client),
  and what the exec helper needs of it;
- :mod:`vnetbench.kube.exec`: the helper process that runs one command in a pod (``python -m
  vnetbench.kube.exec``), as ``ssh`` or ``docker exec`` does for the other nodes;
- :mod:`vnetbench.kube.pods`: the run's namespace and pods, labelled, and their removal by label;
- :mod:`vnetbench.kube.node`: a pod as the lab sees an endpoint (:class:`vnetbench.lab.nodes.RunsCommands`).
"""
