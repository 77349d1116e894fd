"""Connect to listening sockets and say what each lets a client do, run inside a namespace of the cluster test.

Run with the pinned ray's interpreter (it has grpcio): `python cluster_probe.py [--token FILE] HOST:PORT ...`;
prints one JSON object per socket: {"target", "class", "detail"}, where class is
- "unreachable": the TCP connection is refused or times out;
- "token": the server refuses this client for its missing (or, with --token, wrong) authentication token:
  HTTP 401/403 on an /api/ path, or gRPC UNAUTHENTICATED;
- "open": the server answers without any token (HTTP 2xx on some path and 401/403 on none, or gRPC OK);
- "answers": with --token, a server that let the token through (any HTTP status but 401/403, any gRPC code but
  UNAUTHENTICATED): the positive control;
- "other": something else (detail says what).
Only read-only calls are made: HTTP GETs, and gRPC methods that list or report (each with an empty request).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

HTTP_PATHS = ("/api/version", "/api/jobs/", "/v1/models", "/health", "/workers", "/metrics", "/")
# Read-only gRPC methods of the pinned ray's servers (ray/core/generated/*_pb2_grpc.py): the GCS, the raylet's node
# manager, the object manager, the dashboard agent, the client server. An unknown method answers UNIMPLEMENTED
# before any authentication check, so each server is asked one it serves.
GRPC_METHODS = (
    "/ray.rpc.NodeInfoGcsService/GetClusterId",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.ObjectManagerService/Pull",
    "/ray.rpc.ReporterService/HealthCheck",
    "/ray.rpc.RayletDriver/ClusterInfo",
    "/ray.rpc.CoreWorkerService/NumPendingTasks",
)
TIMEOUT = 3.0


def http_get(host: str, port: int, path: str, token: str | None) -> int | None:
    """The status of GET path (HTTP/1.1), None when the server does not answer HTTP/1.1."""
    headers = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
    if token:
        headers += f"Authorization: Bearer {token}\r\n"
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
            sock.sendall((headers + "\r\n").encode())
            data = b""
            while b"\r\n" not in data and len(data) < 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    if not data.startswith(b"HTTP/"):
        return None
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def grpc_probe(host: str, port: int, token: str | None) -> tuple[str, str]:
    import grpc

    metadata = [("authorization", f"Bearer {token}")] if token else None
    seen = []
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        for method in GRPC_METHODS:
            call = channel.unary_unary(method, request_serializer=lambda x: x, response_deserializer=lambda x: x)
            try:
                call(b"", timeout=TIMEOUT, metadata=metadata)
                return ("answers" if token else "open"), f"gRPC {method}: OK"
            except grpc.RpcError as exc:
                code = exc.code().name
                if code == "UNIMPLEMENTED":
                    continue
                if code == "UNAUTHENTICATED":
                    return "token", f"gRPC {method}: UNAUTHENTICATED ({(exc.details() or '')[:80]})"
                if code == "UNAVAILABLE":
                    seen.append(f"{method}: UNAVAILABLE")
                    break
                # any other answer comes from the method itself: the call got past authentication
                return ("answers" if token else "open"), f"gRPC {method}: {code}"
    return "other", "; ".join(seen) or "gRPC: no probed method is served"


def probe(target: str, token: str | None) -> dict:
    host, _, port_text = target.rpartition(":")
    port = int(port_text)
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT):
            pass
    except OSError as exc:
        return {"target": target, "class": "unreachable", "detail": f"connect: {exc.strerror or exc}"}
    first = http_get(host, port, HTTP_PATHS[0], token)  # a gRPC server answers HTTP/1.1 with no status line
    if first is not None:
        statuses = {HTTP_PATHS[0]: first, **{path: http_get(host, port, path, token) for path in HTTP_PATHS[1:]}}
        api = {p: s for p, s in statuses.items() if p.startswith("/api/") and s is not None}
        refused = [p for p, s in statuses.items() if s in (401, 403)]
        ok = [p for p, s in statuses.items() if s is not None and 200 <= s < 300]
        detail = "HTTP " + ", ".join(f"{p} {s}" for p, s in statuses.items())
        if token:  # any answer but 401/403 got past the authentication (a 404 is the path's own answer)
            return {"target": target, "class": "token" if refused else "answers", "detail": detail}
        if refused and not any(200 <= s < 300 for s in api.values()):
            return {"target": target, "class": "token", "detail": detail}
        if ok:
            return {"target": target, "class": "open", "detail": detail}
        return {"target": target, "class": "other", "detail": detail}
    cls, detail = grpc_probe(host, port, token)
    return {"target": target, "class": cls, "detail": detail}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--token", default=None, help="a file holding the token to send (the positive control)")
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args()
    token = Path(args.token).read_text().strip() if args.token else None
    for target in args.targets:
        print(json.dumps(probe(target, token)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
