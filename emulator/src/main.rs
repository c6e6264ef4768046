//! vnb-link: userspace link emulator for vnetbench.
//!
//! ```text
//!   host A ──veth── [a]  vnb-link (own netns)  [b] ──veth── host B
//!                     a→b: loss/dup/corrupt → queue → rate → delay+jitter
//!                     b→a: the same, with its own settings
//! ```
//!
//! Usage: vnb-link --iface-a A --iface-b B --config CFG.json
//!                 [--control SOCK|-] [--stats-out FILE] [--cpu N] [--block]
//!        vnb-link ctl SOCK 'JSON'        (send one control request, print the reply)
//!        vnb-link idle-poll CPU...       (keep idle cores polling: idle.rs)
//!        vnb-link wake-probe FROM TO ASLEEP_US SAMPLES   (how late a sleeper wakes: idle.rs)

mod afpacket;
mod aqm;
mod config;
mod control;
mod engine;
mod idle;
mod link;
mod model;
mod packet;
mod trace;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{json, Value};

use afpacket::{Batch, PacketSocket, Pool, TxBatch};
use config::Config;
use engine::Engine;
use packet::Packet;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

#[inline]
fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct Args {
    iface_a: String,
    iface_b: String,
    config: String,
    control: Option<String>,
    stats_out: Option<String>,
    cpu: Option<usize>,
    /// Wait in ppoll(2) when nothing is due instead of spinning: for an emulator without a core of its own,
    /// whose spinning would take the core from the hosts it shares it with (and, at nice -10, most of it).
    block: bool,
}

/// The longest a blocked loop sleeps: control requests and schedule steps wait at most this long.
const BLOCK_MAX_NS: u64 = 1_000_000;

const USAGE: &str = "usage: vnb-link --iface-a IFACE --iface-b IFACE --config CONFIG.json \
[--control UNIX_SOCKET_PATH | --control -] [--stats-out STATS.json] [--cpu N] [--block]\n       \
vnb-link ctl UNIX_SOCKET_PATH 'JSON'\n       vnb-link --check-config CONFIG.json\n       \
vnb-link idle-poll CPU...\n       vnb-link wake-probe FROM_CPU TO_CPU ASLEEP_US SAMPLES";

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut a, mut b, mut c, mut ctl, mut st, mut cpu) = (None, None, None, None, None, None);
    let mut block = false;
    while let Some(k) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match k.as_str() {
            "--iface-a" => a = Some(val("--iface-a")?),
            "--iface-b" => b = Some(val("--iface-b")?),
            "--config" => c = Some(val("--config")?),
            "--control" => ctl = Some(val("--control")?),
            "--stats-out" => st = Some(val("--stats-out")?),
            "--cpu" => {
                let v = val("--cpu")?;
                cpu = Some(v.parse::<usize>().map_err(|_| format!("--cpu expects a core number, got '{v}'"))?)
            }
            "--block" => block = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
    Ok(Args {
        iface_a: a.ok_or("--iface-a is required")?,
        iface_b: b.ok_or("--iface-b is required")?,
        config: c.ok_or("--config is required")?,
        control: ctl,
        stats_out: st,
        cpu,
        block,
    })
}

fn pin_cpu(cpu: usize) -> Result<(), String> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("CPU {cpu}: a CPU set holds CPUs 0 to {}", libc::CPU_SETSIZE - 1));
    }
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!("sched_setaffinity to CPU {cpu}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// SIGTERM and SIGINT end the loop (STOP); a closed pipe is an error where it is written, not a death.
fn install_stop_handlers() {
    unsafe {
        let h = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGTERM, h);
        libc::signal(libc::SIGINT, h);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Sleep until a frame can be read on one of `socks` or `ns` nanoseconds have passed (a signal ends it too).
fn wait_for_frames(socks: &[&PacketSocket; 2], ns: u64) {
    let mut fds = socks.map(|s| libc::pollfd { fd: s.fd, events: libc::POLLIN, revents: 0 });
    let ts = libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
    unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
}

fn fail(msg: &str) -> ! {
    eprintln!("vnb-link: {msg}");
    std::process::exit(2);
}

fn main() {
    let mut argv = std::env::args().skip(1).peekable();
    match argv.peek().map(|s| s.as_str()) {
        Some("ctl") => {
            argv.next();
            let (Some(path), Some(msg)) = (argv.next(), argv.next()) else { fail(USAGE) };
            match control::request(&path, &msg) {
                Ok(r) => {
                    println!("{r}");
                    let ok = serde_json::from_str::<Value>(&r).ok().and_then(|v| v["ok"].as_bool()).unwrap_or(false);
                    std::process::exit(if ok { 0 } else { 1 });
                }
                Err(e) => fail(&format!("control socket {path}: {e}")),
            }
        }
        Some("idle-poll") => {
            argv.next();
            let cpus = idle::parse_cpus(argv).unwrap_or_else(|e| fail(&e));
            install_stop_handlers();
            idle::run(&cpus, &STOP).unwrap_or_else(|e| fail(&e));
            std::process::exit(0);
        }
        Some("wake-probe") => {
            argv.next();
            let n: Vec<usize> = argv
                .map(|a| a.parse::<usize>().unwrap_or_else(|_| fail(&format!("wake-probe: '{a}' is not a number"))))
                .collect();
            let [from, to, asleep_us, samples] = n[..] else {
                fail("usage: vnb-link wake-probe FROM_CPU TO_CPU ASLEEP_US SAMPLES")
            };
            let asleep = std::time::Duration::from_micros(asleep_us as u64);
            println!("{}", idle::wake_probe(from, to, asleep, samples.max(1)).unwrap_or_else(|e| fail(&e)));
            std::process::exit(0);
        }
        Some("--check-config") => {
            argv.next();
            let Some(path) = argv.next() else { fail(USAGE) };
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| fail(&format!("config {path}: {e}")));
            let cfg = Config::parse(&text).unwrap_or_else(|e| fail(&e));
            let (ab, ba) = cfg.initial().unwrap_or_else(|e| fail(&e));
            ab.compile().unwrap_or_else(|e| fail(&format!("config: a_to_b: {e}")));
            ba.compile().unwrap_or_else(|e| fail(&format!("config: b_to_a: {e}")));
            cfg.sorted_schedule().unwrap_or_else(|e| fail(&e));
            println!("{}", json!({"ok": true, "settings": {"a_to_b": ab, "b_to_a": ba}}));
            return;
        }
        _ => {}
    }
    let args = parse_args(argv).unwrap_or_else(|e| fail(&e));
    if args.iface_a == args.iface_b {
        fail("--iface-a and --iface-b must be different interfaces");
    }
    let text = std::fs::read_to_string(&args.config).unwrap_or_else(|e| fail(&format!("config {}: {e}", args.config)));
    let cfg = Config::parse(&text).unwrap_or_else(|e| fail(&e));
    let (ab, ba) = cfg.initial().unwrap_or_else(|e| fail(&e));
    let pab = ab.compile().unwrap_or_else(|e| fail(&format!("config: a_to_b: {e}")));
    let pba = ba.compile().unwrap_or_else(|e| fail(&format!("config: b_to_a: {e}")));
    let schedule = cfg.sorted_schedule().unwrap_or_else(|e| fail(&e));

    if let Some(c) = args.cpu {
        pin_cpu(c).unwrap_or_else(|e| fail(&e));
    }
    install_stop_handlers();

    let sa = PacketSocket::open(&args.iface_a).unwrap_or_else(|e| fail(&e.to_string()));
    let sb = PacketSocket::open(&args.iface_b).unwrap_or_else(|e| fail(&e.to_string()));
    let ctl = match args.control.as_deref() {
        None => None,
        Some("-") => Some(control::Control::stdin().unwrap_or_else(|e| fail(&format!("control on stdin: {e}")))),
        Some(p) => Some(control::Control::unix(p).unwrap_or_else(|e| fail(&format!("control socket {p}: {e}")))),
    };

    // Frame buffers: the larger MTU + Ethernet header, rounded up.
    let slot = (sa.mtu.max(sb.mtu) + packet::ETH_HLEN + 64).next_multiple_of(64);
    let mut pool = Pool::new(slot, 4096);
    let mut rx = [Batch::new(&mut pool), Batch::new(&mut pool)];
    let mut txb = TxBatch::new();
    let socks = [&sa, &sb];
    sa.flush();
    sb.flush();

    let t0 = now_ns();
    let mut eng = Engine::new([ab, ba], [pab, pba], cfg.seed, schedule, t0);
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
    }

    let mut inbox: Vec<Packet> = Vec::with_capacity(afpacket::BATCH);
    let mut outbox: Vec<Packet> = Vec::with_capacity(afpacket::BATCH);
    let mut last_arrival = [t0; 2];
    let mut warned_oversize = false;
    let mut warned_rx = false;
    let mut warned_tx = false;

    while !STOP.load(Ordering::Relaxed) {
        let now = now_ns();
        let mut moved = 0usize; // frames received or sent this iteration: a blocking loop sleeps only when none
        // Schedule and control first, so a change applies before the next packets.
        if eng.schedule_due(now) {
            for e in eng.run_schedule(now) {
                eprintln!("vnb-link: warning: {e}");
            }
        }
        if let Some(c) = &ctl {
            if c.pending.swap(false, Ordering::Acquire) {
                while let Ok(req) = c.rx.try_recv() {
                    let r = eng.handle_ctl(&req.line, now_ns());
                    let _ = req.reply.send(r);
                }
            }
        }
        // Ingress on both interfaces: direction d is received on socks[d].
        //
        // Virtual time of a direction only runs up to its receive horizon: the
        // instant before which every frame the kernel timestamped has been read.
        // A frame that waited in the socket while we were not running (another
        // task had the CPU) is then queued as of its true arrival, so queueing
        // and drops are as if we had never been away.
        for d in 0..2 {
            let link = &mut eng.links[d];
            let before = now_ns();
            let r = rx[d].recv(socks[d], &mut pool, &mut inbox);
            moved += r.raw;
            if r.oversize > 0 {
                link.stats.rx_packets += r.oversize as u64;
                link.stats.rx_bytes += r.oversize_bytes;
                link.stats.dropped_oversize += r.oversize as u64;
                if !warned_oversize {
                    warned_oversize = true;
                    let s = socks[d];
                    eprintln!(
                        "vnb-link: warning: dropped a {}-byte frame on {} that cannot be forwarded (MTU {} allows {} \
                         bytes; offloaded TCP and UDP frames up to {} bytes are forwarded and counted as their \
                         segments): turn segmentation offloads off on the sending end \
                         (ethtool -K IFACE gso off tso off); further such frames are counted as dropped_oversize",
                        r.oversize_len,
                        s.name,
                        s.mtu,
                        s.mtu + packet::ETH_HLEN,
                        afpacket::MAX_OFFLOADED_FRAME
                    );
                }
            }
            if let (Some(e), false) = (r.error, warned_rx) {
                warned_rx = true;
                eprintln!("vnb-link: warning: receive on {}: {}", socks[d].name, std::io::Error::from_raw_os_error(e));
            }
            let mut horizon = before;
            if !inbox.is_empty() {
                // Kernel timestamps, kept monotonic per direction and never in
                // the future (0 = none: the time we looked).
                let after = now_ns();
                for p in inbox.drain(..) {
                    let t = if p.arrival == 0 { after } else { p.arrival.min(after) };
                    let t = t.max(last_arrival[d]);
                    last_arrival[d] = t;
                    link.ingress(p, t); // runs the link up to t first
                }
                if r.raw == afpacket::BATCH {
                    // More may be waiting: only the last frame's time is known complete.
                    horizon = last_arrival[d];
                }
            }
            horizon = horizon.max(last_arrival[d]);
            link.advance(horizon);
            for v in link.recycle.drain(..) {
                pool.put(v);
            }
        }
        // Egress: release what is due, a→b out of b and b→a out of a.
        let now = now_ns();
        for d in 0..2 {
            let link = &mut eng.links[d];
            loop {
                while outbox.len() < afpacket::BATCH {
                    match link.pop_ready(now) {
                        Some(p) => outbox.push(p),
                        None => break,
                    }
                }
                if outbox.is_empty() {
                    break;
                }
                let full = outbox.len() == afpacket::BATCH;
                let r = txb.send(socks[1 - d], &mut outbox, &mut pool);
                link.stats.forwarded_packets += r.sent as u64;
                moved += r.sent;
                link.stats.forwarded_bytes += r.sent_bytes;
                link.stats.tx_errors += r.errors as u64;
                if let (Some(e), false) = (r.last_error, warned_tx) {
                    warned_tx = true;
                    eprintln!(
                        "vnb-link: warning: send on {}: {}",
                        socks[1 - d].name,
                        std::io::Error::from_raw_os_error(e)
                    );
                }
                if !full {
                    break;
                }
            }
        }
        if args.block && moved == 0 {
            let wake = eng.next_due().map_or(BLOCK_MAX_NS, |t| t.saturating_sub(now_ns()).min(BLOCK_MAX_NS));
            if wake > 0 {
                wait_for_frames(&socks, wake);
            }
        }
    }

    let end = now_ns();
    if let Some(path) = &args.stats_out {
        let out = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "iface_a": args.iface_a,
            "iface_b": args.iface_b,
            "duration_s": (end - t0) as f64 / 1e9,
            "seed": cfg.seed,
            "schedule_steps_applied": eng.steps_applied,
            "control_updates_applied": eng.updates_applied,
            "a_to_b": eng.links[0].snapshot(),
            "b_to_a": eng.links[1].snapshot(),
            "settings": eng.settings_json(),
        });
        let text = serde_json::to_string_pretty(&out).unwrap();
        let tmp = format!("{path}.tmp");
        if let Err(e) = std::fs::write(&tmp, text + "\n").and_then(|_| std::fs::rename(&tmp, path)) {
            eprintln!("vnb-link: cannot write stats to {path}: {e}");
            std::process::exit(1);
        }
    }
    if let Some(p) = args.control.as_deref() {
        if p != "-" {
            let _ = std::fs::remove_file(p);
        }
    }
    std::process::exit(0);
}
