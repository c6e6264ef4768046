"""Numbered UDP datagrams for the fidelity measurements (stdlib only, run inside
a lab namespace with ``python -m vnetbench.impair.udpprobe``).

    sink  --bind IP --port P --out FILE [--idle S] [--max S]
          records every datagram's sequence number and kernel receive time
          (SO_TIMESTAMPNS, CLOCK_REALTIME ns); prints "ready" once bound
    blast --dst IP --port P --count N --size B [--pps R]
          sends N datagrams numbered 0..N-1 of B bytes, R per second in 1 ms
          batches (no --pps: back to back); prints a JSON summary

Only ever sends to the address it is given; the lab gives it 198.18.0.0/15.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def sink(args: argparse.Namespace) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind((args.bind, args.port))
    print("ready", flush=True)
    seqs: list[int] = []
    stamps: list[int] = []
    deadline = time.monotonic() + args.max
    s.settimeout(args.max)
    while time.monotonic() < deadline:
        try:
            data, anc, _flags, _addr = s.recvmsg(65536, 64)
        except socket.timeout:
            break
        if len(data) < 8:
            continue
        ts = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
                sec, nsec = struct.unpack("qq", payload[:16])
                ts = sec * 1_000_000_000 + nsec
        seqs.append(struct.unpack("!Q", data[:8])[0])
        stamps.append(ts if ts is not None else time.time_ns())
        s.settimeout(args.idle)
    with open(args.out, "w") as f:
        json.dump({"seq": seqs, "t_ns": stamps}, f)
    return 0


def blast(args: argparse.Namespace) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 << 20)
    s.connect((args.dst, args.port))
    pad = bytes(max(0, args.size - 8))
    t0 = time.time()
    start = time.monotonic()
    errors = 0
    i = 0
    while i < args.count:
        if args.pps:
            due = int((time.monotonic() - start) * args.pps) + 1
            while i < min(due, args.count):
                try:
                    s.send(struct.pack("!Q", i) + pad)
                except OSError:
                    errors += 1
                i += 1
            nxt = start + i / args.pps
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(min(delay, 0.001))
        else:
            try:
                s.send(struct.pack("!Q", i) + pad)
            except OSError:
                errors += 1
            i += 1
    print(json.dumps({"sent": args.count, "errors": errors, "t0": t0, "t1": time.time()}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="udpprobe")
    sub = p.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("sink")
    a.add_argument("--bind", required=True)
    a.add_argument("--port", type=int, default=9000)
    a.add_argument("--out", required=True)
    a.add_argument("--idle", type=float, default=1.0)
    a.add_argument("--max", type=float, default=30.0)
    b = sub.add_parser("blast")
    b.add_argument("--dst", required=True)
    b.add_argument("--port", type=int, default=9000)
    b.add_argument("--count", type=int, required=True)
    b.add_argument("--size", type=int, default=1000)
    b.add_argument("--pps", type=float, default=0.0)
    args = p.parse_args(argv)
    return sink(args) if args.mode == "sink" else blast(args)


if __name__ == "__main__":
    sys.exit(main())
