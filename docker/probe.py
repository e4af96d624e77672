#!/usr/bin/python3
"""Waits until a Kubernetes-style readiness probe of a pod passes, as the kubelet runs it,
for scripts/container-test.sh (run in the image, on the pods' network):

    python3 probe.py --host HOST --timeout_s 120 grpc PORT [SERVICE]
    python3 probe.py --host HOST --timeout_s 120 http PORT PATH
    python3 probe.py --host HOST --timeout_s 120 tcp PORT

grpc: grpc.health.v1.Health/Check for SERVICE ("" when left out) answers SERVING. The
request and answer are encoded here by hand (field 1 of each, a string and an enum), so
only python3-grpcio is needed, not the grpc_health package. http: GET answers 2xx or
3xx. tcp: the port accepts a connection. Each attempt has a 2 s deadline; one every
0.5 s until --timeout_s.

Exit codes: 0 ready, 1 not ready by the deadline (the last failure is printed), 2 usage.
"""

import argparse
import socket
import sys
import time
import urllib.request

SERVING = 1


def grpc_check(host, port, service):
    import grpc  # python3-grpcio: only this kind needs it

    name = service.encode()
    request = b"\x0a" + bytes([len(name)]) + name if name else b""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        answer = check(request, timeout=2)
    status = answer[1] if len(answer) >= 2 and answer[0] == 0x08 else 0
    if status != SERVING:
        raise RuntimeError(f"health of {service!r} is {status}, not SERVING")


def http_check(host, port, path):
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=2) as r:
        if not 200 <= r.status < 400:
            raise RuntimeError(f"HTTP {r.status}")


def tcp_check(host, port):
    socket.create_connection((host, int(port)), timeout=2).close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", required=True)
    ap.add_argument("--timeout_s", type=float, default=120)
    ap.add_argument("kind", choices=["grpc", "http", "tcp"])
    ap.add_argument("port")
    ap.add_argument("arg", nargs="?", default="", help="grpc: service; http: path")
    args = ap.parse_args()
    if len(args.arg.encode()) > 127:
        ap.error("service name longer than 127 bytes")
    check = {"grpc": lambda: grpc_check(args.host, args.port, args.arg),
             "http": lambda: http_check(args.host, args.port, args.arg or "/"),
             "tcp": lambda: tcp_check(args.host, args.port)}[args.kind]
    deadline = time.monotonic() + args.timeout_s
    while True:
        try:
            check()
            return 0
        except Exception as e:  # noqa: BLE001 (any failure is "not ready yet")
            if time.monotonic() >= deadline:
                print(f"probe: {args.kind} {args.host}:{args.port} {args.arg}: not ready "
                      f"after {args.timeout_s:.0f} s: {e}", file=sys.stderr)
                return 1
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
