//! `vnb-link idle-poll CPU...`: idle cores that poll instead of halting, while a lab is up.
//!
//! An idle core halts, and the next packet for a process on it waits for the core to wake. On a VM
//! the hypervisor takes a halted virtual CPU off its physical one, and the wake-up costs the host's
//! scheduling: 96 us a wake on the 2-core VM against 22-72 polled, paid twice by every round trip
//! through a delay (the cores sit idle while the packets wait). Latency benchmarks hold the wake-up latency at 0 with
//! a PM QoS request (/dev/cpu_dma_latency), but the kernel honours it through its cpuidle driver; a
//! kernel that registered none ("none" in /sys/devices/system/cpu/cpuidle/current_driver) halts all
//! the same. This is the kernel's `idle=poll` from user space for such a kernel: one thread per core,
//! pinned there, under SCHED_IDLE, spinning. SCHED_IDLE runs only when nothing else on the core is
//! runnable, and a task that wakes there preempts it at once, so the core is never halted and never
//! taken from anyone. Start it in a cgroup whose `cpu.idle` is 1 (vnetbench does): the scheduler weighs
//! a group, or a session's autogroup, as a whole, and in its own autogroup the pollers took 30-40 % of
//! a core from a busy loop beside them; in an idle group, 0.4 %, and no more stalls of the loop than
//! without pollers (5-second windows, 8-10 gaps over 1 ms either way on the 2-core VM).
//!
//! Each thread is niced to 19, so /proc/stat counts its time as `nice`, and is named `vnb-idle/N`
//! after its core, so that its time can be counted back as the idle time it is (its schedstat).
//!
//! Prints "ready" once every thread is pinned and idle-scheduled (or fails naming the core and the
//! error); ends on SIGTERM or SIGINT, and when the process that started it is gone (it is re-parented):
//! a killed run leaves no spinning core behind.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// How often the main thread looks for its parent: a killed run's pollers end within this.
const PARENT_CHECK: Duration = Duration::from_millis(100);
const NICE: libc::c_int = 19;

pub fn parse_cpus(args: impl Iterator<Item = String>) -> Result<Vec<usize>, String> {
    let cpus: Vec<usize> = args
        .map(|a| a.parse::<usize>().map_err(|_| format!("idle-poll: '{a}' is not a CPU number")))
        .collect::<Result<_, _>>()?;
    if cpus.is_empty() {
        return Err("idle-poll: name the CPUs to keep polling (vnb-link idle-poll 0 1 ...)".to_string());
    }
    Ok(cpus)
}

/// Pin the calling thread to `cpu`, nice it and make it SCHED_IDLE.
fn idle_here(cpu: usize) -> Result<(), String> {
    crate::pin_cpu(cpu)?;
    unsafe {
        // Threads have their own nice value on Linux: PRIO_PROCESS with the thread's id.
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        if libc::setpriority(libc::PRIO_PROCESS, tid, NICE) != 0 {
            return Err(format!("setpriority({NICE}) on CPU {cpu}: {}", std::io::Error::last_os_error()));
        }
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            return Err(format!("sched_setscheduler(SCHED_IDLE) on CPU {cpu}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Spin until `stop`.
fn poll(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        std::hint::spin_loop();
    }
}

/// Poll `cpus` until `stop` is set (by a signal) or the parent is gone.
pub fn run(cpus: &[usize], stop: &'static AtomicBool) -> Result<(), String> {
    let parent = unsafe { libc::getppid() };
    let (tx, rx) = mpsc::channel::<Result<(), String>>();
    let mut threads = Vec::with_capacity(cpus.len());
    for &cpu in cpus {
        let tx = tx.clone();
        let spawned = thread::Builder::new().name(format!("vnb-idle/{cpu}")).spawn(move || {
            let set = idle_here(cpu);
            let ok = set.is_ok();
            let _ = tx.send(set);
            if ok {
                poll(stop);
            }
        });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                return Err(format!("idle-poll: a thread for CPU {cpu}: {e}"));
            }
        }
    }
    drop(tx);
    let mut result = Ok(());
    for _ in cpus {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                result = Err(format!("idle-poll: {e}"));
                break;
            }
            Err(_) => {
                result = Err("idle-poll: a thread ended before it was set up".to_string());
                break;
            }
        }
    }
    if result.is_ok() {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
        while !stop.load(Ordering::Relaxed) && unsafe { libc::getppid() } == parent {
            thread::sleep(PARENT_CHECK);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_are_numbers_and_at_least_one() {
        assert_eq!(parse_cpus(["0", "3"].map(String::from).into_iter()).unwrap(), vec![0, 3]);
        assert!(parse_cpus(std::iter::empty()).unwrap_err().contains("name the CPUs"));
        assert!(parse_cpus(["x"].map(String::from).into_iter()).unwrap_err().contains("'x' is not a CPU"));
    }

    #[test]
    fn a_core_it_may_not_use_is_named() {
        static STOP: AtomicBool = AtomicBool::new(false);
        let err = run(&[1000], &STOP).unwrap_err();
        assert!(err.contains("CPU 1000"), "{err}");
    }
}

/// `vnb-link wake-probe`: how late a process asleep on one core wakes when another core hands it a message.
///
/// A request/response exchange through a delay pays this twice a round trip (server and client each sleep
/// through the delay), where an exchange without delay finds them barely asleep. On metal it is microseconds;
/// on a VM the hypervisor delivers the wake-up to a virtual CPU, tens to hundreds of microseconds. Measured as
/// latency tools measure a wake-up (cyclictest), with a pipe between two threads pinned to two cores: the median
/// time from the write to the reader running, after `asleep` of sleep and right away. One JSON line.
pub fn wake_probe(from: usize, to: usize, asleep: Duration, samples: usize) -> Result<String, String> {
    let (mut ping, mut pong) = ([0 as libc::c_int; 2], [0 as libc::c_int; 2]);
    if unsafe { libc::pipe(ping.as_mut_ptr()) } != 0 || unsafe { libc::pipe(pong.as_mut_ptr()) } != 0 {
        return Err(format!("wake-probe: pipe: {}", std::io::Error::last_os_error()));
    }
    let (ping_r, pong_w) = (ping[0], pong[1]);
    let sleeper = thread::spawn(move || -> Result<(), String> {
        crate::pin_cpu(to)?;
        let mut sent = [0u8; 8];
        loop {
            if unsafe { libc::read(ping_r, sent.as_mut_ptr() as *mut libc::c_void, 8) } != 8 {
                return Ok(()); // the writer closed: done
            }
            let late = crate::now_ns().saturating_sub(u64::from_ne_bytes(sent));
            unsafe { libc::write(pong_w, late.to_ne_bytes().as_ptr() as *const libc::c_void, 8) };
        }
    });
    let measure = |pause: Duration| -> Result<u64, String> {
        let mut lates = Vec::with_capacity(samples);
        for _ in 0..samples {
            if !pause.is_zero() {
                thread::sleep(pause);
            }
            let now = crate::now_ns().to_ne_bytes();
            let mut late = [0u8; 8];
            let ok = unsafe { libc::write(ping[1], now.as_ptr() as *const libc::c_void, 8) } == 8
                && unsafe { libc::read(pong[0], late.as_mut_ptr() as *mut libc::c_void, 8) } == 8;
            if !ok {
                return Err(format!("wake-probe: pipe: {}", std::io::Error::last_os_error()));
            }
            lates.push(u64::from_ne_bytes(late));
        }
        lates.sort_unstable();
        Ok(lates[lates.len() / 2])
    };
    let result = crate::pin_cpu(from).and_then(|_| Ok((measure(Duration::ZERO)?, measure(asleep)?)));
    unsafe {
        libc::close(ping[1]);
        libc::close(pong[0]);
    }
    let joined = sleeper.join().map_err(|_| "wake-probe: the sleeping thread panicked".to_string())?;
    unsafe {
        libc::close(ping_r);
        libc::close(pong_w);
    }
    joined?;
    let (at_once, after_sleep) = result?;
    Ok(format!(
        "{{\"from_cpu\": {from}, \"to_cpu\": {to}, \"asleep_us\": {}, \"samples\": {samples}, \
         \"wake_us_at_once\": {:.1}, \"wake_us_after_sleep\": {:.1}}}",
        asleep.as_micros(),
        at_once as f64 / 1e3,
        after_sleep as f64 / 1e3
    ))
}
