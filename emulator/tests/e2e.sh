#!/usr/bin/env bash
# End-to-end check of vnb-link (run as root, from anywhere):
#
#   vnb-emu-<pid>-h1            vnb-emu-<pid>-mid                 vnb-emu-<pid>-h2
#   eth0 198.18.0.1/24 ──veth── a   vnb-link (cpu 1)   b ──veth── eth0 198.18.0.2/24
#
# Measures, offloads off on all four veth ends: ping RTT with 10 ms delay each
# way, iperf3 TCP goodput at 50 and 500 Mbit/s, and the unlimited-rate
# throughput with 10 ms each way (1 and 8 flows); then that throughput again
# with the veths' own offloads (TSO/GSO on), which vnb-link forwards whole.
# Traffic only on 198.18.0.0/15.
# The namespaces and every process started here are removed on exit.
#
# Environment: VNB_LINK=path to the binary (default: build with cargo),
#              E2E_DURATION=iperf3 seconds (default 10), E2E_STRICT=1 to exit
#              non-zero when a target is missed, E2E_EMU_CPU / E2E_APP_CPU (1 / 0),
#              E2E_EMU_NICE (0).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CRATE="$(dirname "$HERE")"
DUR="${E2E_DURATION:-10}"
STRICT="${E2E_STRICT:-0}"
EMU_CPU="${E2E_EMU_CPU:-1}"
APP_CPU="${E2E_APP_CPU:-0}"
EMU_NICE="${E2E_EMU_NICE:-0}"   # e.g. -10 on a machine shared with other work

[ "$(id -u)" = 0 ] || { echo "e2e.sh: must run as root" >&2; exit 2; }
for t in ip ethtool iperf3 ping python3 taskset; do
  command -v "$t" >/dev/null || { echo "e2e.sh: missing tool: $t" >&2; exit 2; }
done

if [ -z "${VNB_LINK:-}" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release --quiet --manifest-path "$CRATE/Cargo.toml"
  VNB_LINK="$CRATE/target/release/vnb-link"
fi

P="vnb-emu-$$"
H1="$P-h1"; H2="$P-h2"; MID="$P-mid"
WORK="$(mktemp -d /tmp/vnb-emu-e2e.XXXXXX)"
CTL="$WORK/ctl.sock"
EMU_PID=""; IPERF_PID=""; ECHO_PID=""
FAILS=0

cleanup() {
  set +e
  for p in "$IPERF_PID" "$ECHO_PID"; do [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  if [ -n "$EMU_PID" ]; then
    kill -TERM "$EMU_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$EMU_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$EMU_PID" 2>/dev/null
    wait "$EMU_PID" 2>/dev/null
  fi
  for ns in "$H1" "$H2" "$MID"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

nsx() { local ns="$1"; shift; ip netns exec "$ns" "$@"; }

for ns in "$H1" "$H2" "$MID"; do ip netns add "$ns"; done
ip -n "$H1" link add eth0 type veth peer name a netns "$MID"
ip -n "$H2" link add eth0 type veth peer name b netns "$MID"
nsx "$MID" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
for ns in "$H1" "$H2"; do
  nsx "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  ip -n "$ns" link set lo up
done
ip -n "$H1" addr add 198.18.0.1/24 dev eth0
ip -n "$H2" addr add 198.18.0.2/24 dev eth0
# Offloads off on the middle ends and on the hosts' ends for the timing checks:
# every frame is one packet. Checksum offload stays on (vnb-link keeps the
# checksum state via PACKET_VNET_HDR). Section 4 turns segmentation offload back on.
for i in a b; do
  nsx "$MID" ethtool -K "$i" gso off gro off tso off >/dev/null
  ip -n "$MID" link set dev "$i" up
done
for ns in "$H1" "$H2"; do nsx "$ns" ethtool -K eth0 gso off gro off tso off >/dev/null; done
ip -n "$H1" link set dev eth0 up
ip -n "$H2" link set dev eth0 up

cat >"$WORK/cfg.json" <<'EOF'
{"seed": 1, "both": {"delay_ms": 10}}
EOF

ip netns exec "$MID" nice -n "$EMU_NICE" "$VNB_LINK" --iface-a a --iface-b b --config "$WORK/cfg.json" \
  --control "$CTL" --stats-out "$WORK/stats.json" --cpu "$EMU_CPU" \
  >"$WORK/emu.out" 2>"$WORK/emu.err" &
EMU_PID=$!
for _ in $(seq 100); do grep -qx ready "$WORK/emu.out" 2>/dev/null && break; sleep 0.05; done
grep -qx ready "$WORK/emu.out" || { echo "vnb-link did not get ready:"; cat "$WORK/emu.err"; exit 1; }

ctl() { nsx "$MID" "$VNB_LINK" ctl "$CTL" "$1" >/dev/null; }
check() { # name value op target
  if python3 -c "import sys; sys.exit(0 if $2 $3 $4 else 1)"; then
    printf '  %-44s %s (target %s %s) ok\n' "$1" "$2" "$3" "$4"
  else
    printf '  %-44s %s (target %s %s) MISSED\n' "$1" "$2" "$3" "$4"; FAILS=$((FAILS + 1))
  fi
}

echo "== vnb-link e2e (namespaces $P-*, emulator on CPU $EMU_CPU nice $EMU_NICE, apps on CPU $APP_CPU, load $(cut -d' ' -f1-3 /proc/loadavg))"

# --- 1. RTT with 10 ms delay each way -----------------------------------------
nsx "$H1" ping -c 3 -i 0.2 -q 198.18.0.2 >/dev/null   # ARP warm-up
nsx "$H1" taskset -c "$APP_CPU" ping -c 200 -i 0.01 -s 56 198.18.0.2 >"$WORK/ping.txt" || true
read -r MED P99 N < <(python3 - "$WORK/ping.txt" <<'PY'
import re, sys, statistics
r = [float(m) for m in re.findall(r"time=([0-9.]+) ms", open(sys.argv[1]).read())]
r.sort()
p99 = r[min(len(r) - 1, int(round(0.99 * (len(r) - 1))))]
print(f"{statistics.median(r):.3f} {p99:.3f} {len(r)}")
PY
)
echo "ping: $N replies, RTT median ${MED} ms, p99 ${P99} ms (delay 10 ms each way)"
check "rtt median |x-20| ms" "$(python3 -c "print(round(abs($MED-20),3))")" "<=" 0.2
check "rtt p99 - 20 ms" "$(python3 -c "print(round($P99-20,3))")" "<=" 1.0

# Same path with microsecond resolution (ping prints 0.1 ms at 20 ms): a UDP
# echo between the hosts, 200 probes every 10 ms, bounded in count and time.
cat >"$WORK/udpecho.py" <<'PY'
import socket, statistics, sys, time
mode, addr = sys.argv[1], (sys.argv[2], 7007)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if mode == "server":
    s.bind(addr); s.settimeout(30)
    try:
        while True:
            d, a = s.recvfrom(2048)
            s.sendto(d, a)
            if d == b"stop":
                break
    except socket.timeout:
        pass
else:
    s.settimeout(1.0); s.bind((sys.argv[3], 0)); rtts = []
    TS = getattr(socket, "SO_TIMESTAMPNS", 35)  # 35 = SO_TIMESTAMPNS on Linux
    s.setsockopt(socket.SOL_SOCKET, TS, 1)
    for i in range(200):
        t = time.time_ns(); s.sendto(i.to_bytes(4, "big") + bytes(60), addr)
        try:
            while True:
                d, anc, _, _ = s.recvmsg(2048, 64)
                if int.from_bytes(d[:4], "big") == i:
                    rx = next((int.from_bytes(c[2][:8], "little") * 10**9 + int.from_bytes(c[2][8:16], "little")
                               for c in anc if c[0] == socket.SOL_SOCKET and c[1] == TS), time.time_ns())
                    rtts.append((rx - t) / 1e6); break
        except socket.timeout:
            pass
        time.sleep(max(0.0, 0.010 - (time.time_ns() - t) / 1e9))
    s.sendto(b"stop", addr)
    rtts.sort()
    print(f"{statistics.median(rtts):.3f} {rtts[min(len(rtts)-1, round(0.99*(len(rtts)-1)))]:.3f} {len(rtts)}")
PY
ip netns exec "$H2" taskset -c "$APP_CPU" python3 "$WORK/udpecho.py" server 198.18.0.2 &
ECHO_PID=$!
sleep 0.3
read -r UMED UP99 UN < <(nsx "$H1" taskset -c "$APP_CPU" python3 "$WORK/udpecho.py" client 198.18.0.2 198.18.0.1 || echo "nan nan 0")
wait "$ECHO_PID" 2>/dev/null || true
# Informational: the echo server is a user process, so its scheduling delay on a
# busy machine is in these numbers (ping's echo is answered in the kernel).
echo "udp echo (info, µs resolution, kernel rx timestamps): $UN replies, RTT median ${UMED} ms, p99 ${UP99} ms"

# --- 2. TCP goodput at 50 and 500 Mbit/s --------------------------------------
ip netns exec "$H2" taskset -c "$APP_CPU" iperf3 -s -B 198.18.0.2 -p 5201 >/dev/null 2>&1 &
IPERF_PID=$!
sleep 0.5
EFF=$(python3 -c "print(1448/1514)")   # TCP/IPv4 with timestamps, 1500 MTU, per Ethernet frame
iperf() { # extra args...
  nsx "$H1" taskset -c "$APP_CPU" iperf3 -c 198.18.0.2 -p 5201 -t "$DUR" -O 2 -J "$@" >"$WORK/iperf.json"
  python3 -c "import json,sys; d=json.load(open('$WORK/iperf.json')); print(round(d['end']['sum_received']['bits_per_second']/1e6,2))"
}
for RATE in 50 500; do
  BUF=$((RATE * 1000000 / 8 * 20 / 1000))   # one BDP at 20 ms RTT
  ctl "{\"both\": {\"rate_bps\": $((RATE * 1000000)), \"buffer_bytes\": $BUF, \"buffer_packets\": null}}"
  G=$(iperf)
  FR=$(python3 -c "print(round($G/($RATE*$EFF), 4))")
  echo "iperf3 TCP at ${RATE} Mbit/s, 10 ms each way, buffer ${BUF} B: goodput ${G} Mbit/s = ${FR} of rate x ${EFF:0:6}"
  if [ "$RATE" = 50 ]; then check "goodput fraction @50M" "$FR" ">=" 0.97; else check "goodput fraction @500M" "$FR" ">=" 0.90; fi
done

# --- 3. Unlimited rate, 10 ms each way ----------------------------------------
# One flow at 10 Gbit/s over a 20 ms RTT needs 25 MB in flight: TCP's buffer
# limits are raised in both hosts so that the window does not cap what is measured.
for ns in "$H1" "$H2"; do
  nsx "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 131072 67108864" net.ipv4.tcp_wmem="4096 16384 67108864"
done
ctl '{"both": {"rate_bps": 0, "buffer_bytes": null, "buffer_packets": 100000}}'
G1=$(iperf)
G8=$(iperf -P 8)
echo "iperf3 TCP unlimited rate, 10 ms each way, offloads off: 1 flow ${G1} Mbit/s, 8 flows ${G8} Mbit/s"
check "offloads off, 1 flow Mbit/s" "$G1" ">=" 3000
check "offloads off, 8 flows Mbit/s" "$G8" ">=" 3000

# --- 4. The same with segmentation offload on ----------------------------------
for i in a b; do nsx "$MID" ethtool -K "$i" gso on tso on >/dev/null; done
for ns in "$H1" "$H2"; do nsx "$ns" ethtool -K eth0 gso on tso on >/dev/null; done
O1=$(iperf)
O8=$(iperf -P 8)
echo "iperf3 TCP unlimited rate, 10 ms each way, offloads on: 1 flow ${O1} Mbit/s, 8 flows ${O8} Mbit/s"
check "offloads on, 1 flow Mbit/s" "$O1" ">=" 8000
check "offloads on, 8 flows Mbit/s" "$O8" ">=" 8000

kill "$IPERF_PID" 2>/dev/null; wait "$IPERF_PID" 2>/dev/null || true; IPERF_PID=""
kill -TERM "$EMU_PID"; wait "$EMU_PID" || true; EMU_PID=""
python3 - "$WORK/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for d in ("a_to_b", "b_to_a"):
    x = s[d]
    print(f"stats {d}: rx {x['rx_packets']} fwd {x['forwarded_packets']} drop_queue {x['dropped_queue']} "
          f"offloaded {x['offloaded_frames']} split {x['segmented_frames']} oversize {x['dropped_oversize']} "
          f"tx_err {x['tx_errors']} max_qdelay {x['max_queue_delay_us']:.0f} us")
PY
if [ -s "$WORK/emu.err" ]; then echo "vnb-link stderr:"; sed 's/^/  /' "$WORK/emu.err"; fi
echo "e2e: $FAILS target(s) missed"
if [ "$STRICT" = 1 ] && [ "$FAILS" -gt 0 ]; then exit 1; fi
exit 0
