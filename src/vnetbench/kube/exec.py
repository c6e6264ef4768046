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

A command whose answer is awaited (:meth:`vnetbench.kube.node.PodNode.run`: ``ss``, ``tc``, ``/proc`` reads) needs
no process of its own: :func:`run_captured` streams it from the calling process, over the same protocol, and
saves the helper's start (an interpreter and its imports, most of a command's cost through the API).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import quote, urlencode

STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
PROTOCOLS = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
OPEN_FAILED = 255


def exec_url(host: str, namespace: str, pod: str, container: str, argv: list[str]) -> str:
    query = [("container", container), ("stdin", "true"), ("stdout", "true"), ("stderr", "true")]
    query += [("command", a) for a in argv]
    base = host.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return f"{base}/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/exec?{urlencode(query)}"


def exit_status(status: dict) -> tuple[int, str]:
    """The command's exit status from the stream's final status object (metav1.Status), and what to say on
    its standard error when the command did not run ("" when it did)."""
    if status.get("status") == "Success":
        return 0, ""
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", "")), ""
            except ValueError:
                break
    message = str(status.get("message", status))
    return (127 if "not found" in message or "no such file" in message else 126), f"vnb-kube-exec: {message}\n"


def exit_code(status: dict) -> int:
    code, said = exit_status(status)
    sys.stderr.write(said)
    return code


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


class OpenFailed(Exception):
    """The stream could not be opened; the message says why, as the helper says it on standard error."""


def open_stream(cred: dict, namespace: str, pod: str, container: str, argv: list[str], timeout: float = 30.0) -> Any:
    """The exec stream of `argv` in the pod, opened (a websocket-client WebSocket); OpenFailed if it is not."""
    import websocket

    headers = [f"Authorization: {cred['authorization']}"] if cred.get("authorization") else []
    try:
        return websocket.create_connection(exec_url(cred["host"], namespace, pod, container, argv), header=headers,
                                           subprotocols=PROTOCOLS, sslopt=_ssl_options(cred),
                                           enable_multithread=True, timeout=timeout)
    except websocket.WebSocketBadStatusException as e:
        body = (e.resp_body or b"").decode(errors="replace")
        try:
            body = json.loads(body).get("message", body)
        except ValueError:
            pass
        raise OpenFailed(f"vnb-kube-exec: {namespace}/{pod}: the API refused the exec (HTTP {e.status_code}): "
                         f"{body}\n") from None
    except (OSError, websocket.WebSocketException) as e:
        raise OpenFailed(f"vnb-kube-exec: {namespace}/{pod}: cannot reach the API at {cred['host']}: {e}\n") from None


def run_captured(cred: dict, namespace: str, pod: str, container: str, argv: list[str], timeout: float,
                 limit: int | None = None) -> subprocess.CompletedProcess:
    """`argv` run in the pod from this process, its output captured: subprocess.run's answer (text, undecodable
    bytes as U+FFFD; exit status 255 and the reason on standard error when the stream did not open, as the
    helper's). The command's input stays open until its status arrives (the pod's wrapper stops a command whose
    input closes); past `timeout` the stream is closed, which stops the command in the pod, and
    subprocess.TimeoutExpired is raised; an output beyond `limit` bytes does the same with OutputTooLarge."""
    import websocket

    from vnetbench.lab.nodes import too_large

    deadline = time.monotonic() + timeout
    try:
        ws = open_stream(cred, namespace, pod, container, argv, timeout=max(0.1, min(30.0, timeout)))
    except OpenFailed as e:
        return subprocess.CompletedProcess(argv, OPEN_FAILED, "", str(e))
    taken = {STDOUT: bytearray(), STDERR: bytearray()}
    status: dict | None = None
    try:
        while status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(argv, timeout)
            ws.settimeout(left)
            try:
                opcode, data = ws.recv_data()
            except websocket.WebSocketTimeoutException:
                raise subprocess.TimeoutExpired(argv, timeout) from None
            except (OSError, websocket.WebSocketException):
                break
            if opcode == websocket.ABNF.OPCODE_CLOSE or not data:
                break
            channel, payload = data[0], data[1:]
            if channel in taken:
                taken[channel] += payload
                if limit is not None and len(taken[channel]) > limit:
                    raise too_large(argv, limit, "output" if channel == STDOUT else "error output")
            elif channel == STATUS:
                status = json.loads(payload or b"{}")
    finally:
        # The socket closed, no closing handshake: past the status nothing more comes, and before it (a timeout,
        # an answer too large, Ctrl-C) the stream's end is what stops the command in the pod.
        ws.shutdown()
    out, err = (bytes(taken[c]).decode("utf-8", "replace") for c in (STDOUT, STDERR))
    if status is None:
        return subprocess.CompletedProcess(
            argv, OPEN_FAILED, out, err + f"vnb-kube-exec: {namespace}/{pod}: the stream ended without the command's "
            "status\n")
    code, said = exit_status(status)
    return subprocess.CompletedProcess(argv, code, out, err + said)


def main(args: list[str]) -> int:
    import websocket

    if len(args) < 5:
        sys.stderr.write("usage: python -m vnetbench.kube.exec CREDENTIALS NAMESPACE POD CONTAINER ARGV...\n")
        return 2
    with open(args[0]) as f:
        cred = json.load(f)
    namespace, pod, container, argv = args[1], args[2], args[3], args[4:]
    try:
        ws = open_stream(cred, namespace, pod, container, argv)
    except OpenFailed as e:
        sys.stderr.write(str(e))
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
