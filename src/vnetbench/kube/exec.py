"""Run one command in a pod through the Kubernetes API, as ``ssh`` or ``docker exec`` runs one on the other
nodes: ``python -m vnetbench.kube.exec CREDENTIALS NAMESPACE POD CONTAINER ARGV...``.

The process's standard input, output and error are the command's; its exit status is the command's (255 when
the stream could not be opened, as ssh's). The stream is the API's exec subresource over a WebSocket
(apiserver -> kubelet -> the runtime's streaming server), framed by the ``channel.k8s.io`` subprotocol: one
byte naming the stream (0 stdin, 1 stdout, 2 stderr, 3 the final status), then the data.

When this process's input ends, the command's input is closed (protocol v5's CLOSE frame; on a v4-only server
the stream is ended, which closes it too), and its output is read until the final status: the node's exec
wrapper (/bin/vnb-exec in the tools image) then stops the command and says its CPU time, as in a container.
When this process is killed, the stream ends with it and the wrapper stops the command in the pod.

A helper process rather than the ``kubernetes`` client's own stream: a run starts hundreds of commands, and
importing that client costs 0.5-1 s each here; this imports websocket-client alone (the library that client
streams with) and reads the credentials :func:`vnetbench.kube.api.write_credentials` wrote.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
from urllib.parse import quote, urlencode

STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
PROTOCOLS = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
OPEN_FAILED = 255


def exec_url(host: str, namespace: str, pod: str, container: str, argv: list[str]) -> str:
    query = [("container", container), ("stdin", "true"), ("stdout", "true"), ("stderr", "true")]
    query += [("command", a) for a in argv]
    base = host.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return f"{base}/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/exec?{urlencode(query)}"


def exit_code(status: dict) -> int:
    """The command's exit status from the stream's final status object (metav1.Status)."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", ""))
            except ValueError:
                break
    message = str(status.get("message", status))
    sys.stderr.write(f"vnb-kube-exec: {message}\n")
    return 127 if "not found" in message or "no such file" in message else 126


def _ssl_options(cred: dict) -> dict:
    if not cred.get("verify", True):
        return {"cert_reqs": ssl.CERT_NONE, "check_hostname": False,
                **({"certfile": cred["cert"], "keyfile": cred.get("key")} if cred.get("cert") else {})}
    options = {"cert_reqs": ssl.CERT_REQUIRED, "check_hostname": True}
    if cred.get("ca"):
        options["ca_certs"] = cred["ca"]
    if cred.get("cert"):
        options.update(certfile=cred["cert"], keyfile=cred.get("key"))
    if cred.get("server_name"):
        options["server_hostname"] = cred["server_name"]
    return options


def main(args: list[str]) -> int:
    import websocket

    if len(args) < 5:
        sys.stderr.write("usage: python -m vnetbench.kube.exec CREDENTIALS NAMESPACE POD CONTAINER ARGV...\n")
        return 2
    with open(args[0]) as f:
        cred = json.load(f)
    namespace, pod, container, argv = args[1], args[2], args[3], args[4:]
    headers = [f"Authorization: {cred['authorization']}"] if cred.get("authorization") else []
    try:
        ws = websocket.create_connection(exec_url(cred["host"], namespace, pod, container, argv), header=headers,
                                         subprotocols=PROTOCOLS, sslopt=_ssl_options(cred),
                                         enable_multithread=True, timeout=30)
    except websocket.WebSocketBadStatusException as e:
        body = (e.resp_body or b"").decode(errors="replace")
        try:
            body = json.loads(body).get("message", body)
        except ValueError:
            pass
        sys.stderr.write(f"vnb-kube-exec: {namespace}/{pod}: the API refused the exec (HTTP {e.status_code}): "
                         f"{body}\n")
        return OPEN_FAILED
    except (OSError, websocket.WebSocketException) as e:
        sys.stderr.write(f"vnb-kube-exec: {namespace}/{pod}: cannot reach the API at {cred['host']}: {e}\n")
        return OPEN_FAILED
    ws.settimeout(None)  # a command may be silent for as long as it runs
    v5 = ws.getsubprotocol() == PROTOCOLS[0]

    def forward_input() -> None:
        try:
            while data := os.read(0, 65536):
                ws.send_binary(bytes([STDIN]) + data)
            if v5:
                ws.send_binary(bytes([CLOSE, STDIN]))
            else:
                ws.close()
        except (OSError, websocket.WebSocketException):
            pass

    threading.Thread(target=forward_input, daemon=True).start()
    status: dict | None = None
    try:
        while True:
            opcode, data = ws.recv_data()
            if opcode == websocket.ABNF.OPCODE_CLOSE or not data:
                break
            channel, payload = data[0], data[1:]
            if channel == STDOUT:
                os.write(1, payload)
            elif channel == STDERR:
                os.write(2, payload)
            elif channel == STATUS:
                status = json.loads(payload or b"{}")
    except (OSError, websocket.WebSocketException):
        pass
    if status is None:
        sys.stderr.write(f"vnb-kube-exec: {namespace}/{pod}: the stream ended without the command's status\n")
        return OPEN_FAILED
    return exit_code(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
