//! One direction of the emulated link, as a pure state machine driven by a
//! clock value passed in (ns). Per packet, in netem+tbf order:
//!
//! ```text
//!  ingress ──► loss ─► duplicate ─► corrupt ─► reorder mark
//!                │lost                              │
//!                ▼                                  ▼
//!             (drop)           queue (drop-tail/drop-head/CoDel/RED/PIE, buffer limit)
//!                                                   │ dequeue when the wire is free
//!                                                   ▼
//!                               serialisation: (len + overhead)*8/rate, or trace opportunities
//!                                                   │ departure
//!                                                   ▼
//!                               delay line: release = departure + delay + jitter
//!                               (FIFO: max(own, previous release) unless reorder_on_jitter;
//!                                reorder-marked packets: release = departure)
//!                                                   │
//!                                                   ▼ release ≤ now
//!                                                 egress
//! ```

use serde::Serialize;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::aqm::{Enq, Queue};
use crate::config::{LossModel, Params, Qdisc};
use crate::model::{jitter_sample, stream, Correlated, LossState, Rng};
use crate::packet::{finalize_checksum, flip_payload_bit, segment, Packet};
use crate::trace::{TraceCursor, OPPORTUNITY_BYTES};

/// Counters of one direction (written to --stats-out and returned by the
/// control channel's "stats" command).
#[derive(Serialize, Debug, Clone, Default, PartialEq)]
pub struct DirStats {
    /// Frames received from the kernel on the ingress interface (incl. oversize).
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Frames handed to the kernel on the egress interface.
    pub forwarded_packets: u64,
    pub forwarded_bytes: u64,
    /// Dropped by the queue: buffer full, drop-head victims and AQM drops.
    pub dropped_queue: u64,
    /// Of dropped_queue, the AQM's decisions (CoDel/RED/PIE).
    pub dropped_aqm: u64,
    /// Lost by the loss model.
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    /// Packets that skipped the delay (netem reorder).
    pub reordered: u64,
    /// Frames this emulator cannot forward (larger than MTU+14 without
    /// segmentation offload, or offloaded in a way it cannot segment), dropped.
    pub dropped_oversize: u64,
    /// Offloaded (GSO) frames received: each is counted in rx_packets as its segments.
    pub offloaded_frames: u64,
    /// Of those, frames split into their segments here because a segment was
    /// lost, duplicated, corrupted, reordered, did not fit the buffer, or
    /// jitter or an AQM was on (every model then sees each segment).
    pub segmented_frames: u64,
    /// Frames the kernel refused to send.
    pub tx_errors: u64,
    /// Largest time a packet waited in the queue before its serialisation began, in µs.
    pub max_queue_delay_us: f64,
    /// Mean of the same, in µs (over dequeued packets).
    pub mean_queue_delay_us: f64,
    #[serde(skip)]
    pub queue_delay_sum_ns: u128,
    #[serde(skip)]
    pub dequeued: u64,
    /// Packets in the queue / on the wire / in the delay line when the stats were taken.
    pub queued_packets: u64,
    pub in_flight_packets: u64,
}

struct InService {
    pkt: Packet,
    /// Rate mode: when serialisation ends.
    t_done: u64,
    /// Trace mode: bytes still to deliver.
    remaining: u64,
}

struct Delayed {
    release: u64,
    seq: u64,
    pkt: Packet,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        self.release == o.release && self.seq == o.seq
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    // Reversed: BinaryHeap is a max-heap, we want the earliest release first.
    fn cmp(&self, o: &Self) -> Ordering {
        o.release.cmp(&self.release).then(o.seq.cmp(&self.seq))
    }
}

pub struct Link {
    pub params: Params,
    pub queue: Queue,
    in_service: Option<InService>,
    link_free_at: u64,
    /// Sub-nanosecond remainder of serialisation times (units: ns * rate).
    ser_carry: u128,
    cursor: Option<TraceCursor>,
    delay_line: BinaryHeap<Delayed>,
    last_release: u64,
    seq: u64,
    loss_state: LossState,
    reorder_state: Correlated,
    rng_loss: Rng,
    rng_dup: Rng,
    rng_corrupt: Rng,
    rng_reorder: Rng,
    rng_jitter: Rng,
    rng_aqm: Rng,
    pub stats: DirStats,
    /// Buffers of dropped packets, for the caller to reuse.
    pub recycle: Vec<Vec<u8>>,
}

impl Link {
    /// `direction` selects independent RNG streams (0 = a→b, 1 = b→a).
    pub fn new(params: Params, seed: u64, direction: u64, now: u64) -> Link {
        let queue = Queue::new(params.qdisc.clone(), params.limit_bytes, params.limit_packets);
        let cursor = params.trace.as_ref().map(|_| TraceCursor::new(now));
        Link {
            params,
            queue,
            in_service: None,
            link_free_at: now,
            ser_carry: 0,
            cursor,
            delay_line: BinaryHeap::with_capacity(4096),
            last_release: 0,
            seq: 0,
            loss_state: LossState::default(),
            reorder_state: Correlated::default(),
            rng_loss: Rng::new(seed, direction, stream::LOSS),
            rng_dup: Rng::new(seed, direction, stream::DUPLICATE),
            rng_corrupt: Rng::new(seed, direction, stream::CORRUPT),
            rng_reorder: Rng::new(seed, direction, stream::REORDER),
            rng_jitter: Rng::new(seed, direction, stream::JITTER),
            rng_aqm: Rng::new(seed, direction, stream::AQM),
            stats: DirStats::default(),
            recycle: Vec::new(),
        }
    }

    /// Apply new settings at time `now`. The packet on the wire finishes its
    /// remaining bits at the new rate; queued packets stay (a smaller buffer
    /// only refuses new arrivals until the queue drains); packets already in
    /// the delay line keep their release times.
    pub fn set_params(&mut self, p: Params, now: u64) {
        self.advance(now);
        let old_trace = self.params.trace.clone();
        let old_rate = self.params.rate_bps;
        // Convert the in-service packet's progress between the two server models.
        if let Some(s) = self.in_service.as_mut() {
            let remaining_bytes: f64 = match &old_trace {
                Some(_) => s.remaining as f64,
                None if old_rate > 0 && s.t_done > now => (s.t_done - now) as f64 * old_rate as f64 / 8e9,
                None => 0.0,
            };
            match &p.trace {
                Some(_) => s.remaining = remaining_bytes.ceil().max(1.0) as u64,
                None if p.rate_bps > 0 => {
                    s.t_done = now + (remaining_bytes * 8e9 / p.rate_bps as f64).round() as u64;
                }
                None => s.t_done = now,
            }
        }
        match (&old_trace, &p.trace) {
            (_, None) => self.cursor = None,
            (Some(a), Some(b)) if std::sync::Arc::ptr_eq(a, b) || **a == **b => {}
            (_, Some(_)) => self.cursor = Some(TraceCursor::new(now)),
        }
        if self.in_service.is_none() {
            // Leaving trace mode: the wire is free from now on, not from some stale time.
            self.link_free_at = self.link_free_at.max(now);
        }
        self.ser_carry = 0;
        self.queue.reconfigure(p.qdisc.clone(), p.limit_bytes, p.limit_packets);
        self.params = p;
        self.advance(now);
    }

    /// A frame arrived at `now`. An offloaded frame (several segments) goes on
    /// whole when every model would treat each of its segments alike;
    /// otherwise it is split here and each segment goes through the models
    /// on its own. Either way the decisions, the queue and the timing are
    /// those of its segments arriving back to back.
    pub fn ingress(&mut self, mut pkt: Packet, now: u64) {
        // The wire and the queue as of `now`, and what of an offloaded frame on the wire is still to start
        // (it counts in the buffer for this packet and, if split, for each of its segments).
        self.advance(now);
        self.queue.backlog = self.in_service_backlog(now);
        pkt.arrival = now;
        pkt.skip_delay = false;
        if pkt.segs <= 1 {
            self.ingress_segment(pkt, now);
            return;
        }
        self.stats.offloaded_frames += 1;
        if self.goes_whole(&pkt) {
            self.stats.rx_packets += pkt.segs as u64;
            self.stats.rx_bytes += pkt.wire_len();
            self.queue_up(pkt, now);
            return;
        }
        self.stats.segmented_frames += 1;
        let mut segments = Vec::with_capacity(pkt.segs as usize);
        let size = pkt.hdr_len as usize + pkt.gso_size();
        segment(pkt, &mut || Vec::with_capacity(size), &mut self.recycle, &mut segments);
        for s in segments {
            self.ingress_segment(s, now);
        }
    }

    /// Can an offloaded frame skip splitting? Not with jitter (each segment
    /// draws its own), nor an AQM (it decides per packet), nor when not all of
    /// its segments fit the buffer. Loss, duplication, corruption and reorder
    /// are drawn for each segment on copies of the random streams: when none
    /// of them happens the copies are kept (the streams advanced as if the
    /// segments had gone one by one); otherwise they are dropped, and the
    /// split segments draw the same values again.
    fn goes_whole(&mut self, pkt: &Packet) -> bool {
        let p = &self.params;
        if p.jitter_ns > 0.0
            || p.trace.is_some()
            || !matches!(self.queue.kind, Qdisc::DropTail)
            || self.queue.would_overflow(pkt)
        {
            return false;
        }
        let no_loss = matches!(p.loss, LossModel::None);
        if no_loss && p.duplicate <= 0.0 && p.corrupt <= 0.0 && p.reorder <= 0.0 {
            return true;
        }
        let (mut state, mut loss) = (self.loss_state.clone(), self.rng_loss.clone());
        let (mut dup, mut corrupt, mut reorder, mut reorder_state) =
            (self.rng_dup.clone(), self.rng_corrupt.clone(), self.rng_reorder.clone(), self.reorder_state.clone());
        for _ in 0..pkt.segs {
            if state.lose(&p.loss, &mut loss)
                || dup.chance(p.duplicate)
                || corrupt.chance(p.corrupt)
                || reorder_state.chance(p.reorder, p.reorder_correlation, &mut reorder)
            {
                return false;
            }
        }
        (self.loss_state, self.rng_loss, self.rng_dup, self.rng_corrupt, self.rng_reorder, self.reorder_state) =
            (state, loss, dup, corrupt, reorder, reorder_state);
        true
    }

    /// The segments of the offloaded frame on the wire that have not started
    /// yet at `now` (wire bytes, count): sent one by one they would still be
    /// in the buffer. Segment j from the end starts at t_done minus the
    /// serialisation of the last segment and of j full ones.
    fn in_service_backlog(&self, now: u64) -> (u64, u64) {
        let Some(s) = &self.in_service else { return (0, 0) };
        let p = &s.pkt;
        let rate = self.params.rate_bps as u128;
        if p.segs <= 1 || rate == 0 || self.params.trace.is_some() || s.t_done <= now {
            return (0, 0);
        }
        let full = (p.hdr_len as usize + p.gso_size()) as u128;
        let last = p.wire_len() as u128 - full * (p.segs as u128 - 1);
        let oh = self.params.overhead_bytes as u128;
        let unit = 8 * 1_000_000_000u128;
        // Time left on the wire, in units where a byte takes `unit`.
        let left = (s.t_done - now) as u128 * rate;
        if left <= (last + oh) * unit {
            return (0, 0);
        }
        let count = ((left - (last + oh) * unit - 1) / ((full + oh) * unit) + 1).min(p.segs as u128 - 1);
        ((last + (count - 1) * full) as u64, count as u64)
    }

    /// One packet on the wire (a frame, or one segment of a split one).
    fn ingress_segment(&mut self, mut pkt: Packet, now: u64) {
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += pkt.len() as u64;
        if self.loss_state.lose(&self.params.loss, &mut self.rng_loss) {
            self.stats.lost += 1;
            self.recycle.push(pkt.data);
            return;
        }
        let dup = if self.rng_dup.chance(self.params.duplicate) {
            self.stats.duplicated += 1;
            Some(pkt.duplicate())
        } else {
            None
        };
        if self.rng_corrupt.chance(self.params.corrupt) {
            finalize_checksum(&mut pkt);
            let bit = self.rng_corrupt.below(u64::MAX);
            if flip_payload_bit(&mut pkt, bit) {
                self.stats.corrupted += 1;
            }
        }
        self.enqueue(pkt, now);
        if let Some(d) = dup {
            self.enqueue(d, now);
        }
    }

    fn enqueue(&mut self, mut pkt: Packet, now: u64) {
        if self.reorder_state.chance(self.params.reorder, self.params.reorder_correlation, &mut self.rng_reorder) {
            pkt.skip_delay = true;
            self.stats.reordered += 1;
        }
        self.queue_up(pkt, now);
    }

    /// Into the queue (decisions made).
    fn queue_up(&mut self, pkt: Packet, now: u64) {
        let rate = match &self.params.trace {
            Some(t) => t.mean_rate_bps() as u64,
            None => self.params.rate_bps,
        };
        if let Err((p, why)) = self.queue.enqueue(pkt, now, &mut self.rng_aqm, rate) {
            self.stats.dropped_queue += 1;
            if why == Enq::DroppedAqm {
                self.stats.dropped_aqm += 1;
            }
            self.recycle.push(p.data);
        }
        self.collect_queue_drops();
    }

    fn collect_queue_drops(&mut self) {
        if !self.queue.dropped.is_empty() {
            for p in self.queue.dropped.drain(..) {
                self.stats.dropped_queue += 1;
                self.recycle.push(p.data);
            }
            self.stats.dropped_aqm += self.queue.aqm_dropped;
            self.queue.aqm_dropped = 0;
        }
    }

    /// A packet's wait in the queue, from its arrival to `start`, the start of
    /// its serialisation. An offloaded frame's segments would have started one
    /// after another, `seg_ns` apart (all but the last are full-sized): they
    /// count as `segs` packets, the k-th waiting k·seg_ns longer.
    fn note_sojourn(&mut self, start: u64, arrival: u64, segs: u32, seg_ns: u64) {
        let d = start.saturating_sub(arrival);
        let n = segs.max(1) as u128;
        let last = d + (n as u64 - 1) * seg_ns;
        self.stats.dequeued += n as u64;
        self.stats.queue_delay_sum_ns += d as u128 * n + seg_ns as u128 * n * (n - 1) / 2;
        let us = last as f64 / 1000.0;
        if us > self.stats.max_queue_delay_us {
            self.stats.max_queue_delay_us = us;
        }
    }

    #[inline]
    fn ser_ns(&mut self, bytes: u64) -> u64 {
        let rate = self.params.rate_bps as u128;
        if rate == 0 {
            return 0;
        }
        let num = bytes as u128 * 8 * 1_000_000_000 + self.ser_carry;
        self.ser_carry = num % rate;
        (num / rate) as u64
    }

    /// Run the queue and the wire up to `now` (virtual times: a packet starts
    /// exactly when the previous one finished, however late we look).
    pub fn advance(&mut self, now: u64) {
        if self.params.trace.is_some() {
            self.advance_trace(now);
        } else {
            self.advance_rate(now);
        }
    }

    fn advance_rate(&mut self, now: u64) {
        loop {
            if let Some(s) = &self.in_service {
                if s.t_done > now {
                    break;
                }
                let s = self.in_service.take().unwrap();
                self.link_free_at = s.t_done;
                self.push_delay_line(s.pkt, s.t_done);
            }
            let t_start = match self.queue.peek() {
                None => break,
                Some(h) => self.link_free_at.max(h.arrival),
            };
            if t_start > now {
                break;
            }
            let p = self.queue.dequeue(t_start);
            self.collect_queue_drops();
            let Some(p) = p else { continue };
            let oh = self.params.overhead_bytes;
            let bytes = p.wire_len() + p.segs as u64 * oh;
            let seg_ns = if p.segs > 1 && self.params.rate_bps > 0 {
                ((p.hdr_len as u64 + p.gso_size() as u64 + oh) as u128 * 8_000_000_000 / self.params.rate_bps as u128)
                    as u64
            } else {
                0
            };
            self.note_sojourn(t_start, p.arrival, p.segs, seg_ns);
            let t_done = t_start + self.ser_ns(bytes);
            self.in_service = Some(InService { pkt: p, t_done, remaining: 0 });
        }
    }

    fn advance_trace(&mut self, now: u64) {
        let trace = self.params.trace.clone().unwrap();
        let cursor = self.cursor.get_or_insert_with(|| TraceCursor::new(now));
        let mut cur = cursor.clone();
        loop {
            let t_opp = cur.time_ns(&trace);
            if t_opp > now {
                break;
            }
            let mut credit = OPPORTUNITY_BYTES;
            while credit > 0 {
                if self.in_service.is_none() {
                    match self.queue.peek() {
                        Some(h) if h.arrival <= t_opp => {}
                        _ => break,
                    }
                    let p = self.queue.dequeue(t_opp);
                    self.collect_queue_drops();
                    let Some(p) = p else { continue };
                    self.note_sojourn(t_opp, p.arrival, p.segs, 0);
                    let remaining = p.wire_len() + p.segs as u64 * self.params.overhead_bytes;
                    self.in_service = Some(InService { pkt: p, t_done: 0, remaining });
                }
                let s = self.in_service.as_mut().unwrap();
                let used = credit.min(s.remaining);
                s.remaining -= used;
                credit -= used;
                if s.remaining == 0 {
                    let s = self.in_service.take().unwrap();
                    self.push_delay_line(s.pkt, t_opp);
                }
            }
            cur.advance(&trace);
        }
        self.cursor = Some(cur);
    }

    fn push_delay_line(&mut self, pkt: Packet, departure: u64) {
        let release = if pkt.skip_delay {
            departure
        } else {
            let p = &self.params;
            let j = jitter_sample(p.jitter_dist, p.jitter_ns, &mut self.rng_jitter);
            let d = (p.delay_ns as f64 + j).max(0.0);
            let mut r = departure + d.round() as u64;
            if !p.reorder_on_jitter {
                r = r.max(self.last_release);
                self.last_release = r;
            }
            r
        };
        self.seq += 1;
        self.delay_line.push(Delayed { release, seq: self.seq, pkt });
    }

    /// When this direction next has something to do with no frame arriving: now (0) while a frame waits in the
    /// queue or is on the wire (its serialisation is polled for), else the delay line's next release; None
    /// when it holds nothing.
    pub fn next_due(&self) -> Option<u64> {
        if self.in_service.is_some() || self.queue.peek().is_some() {
            return Some(0);
        }
        self.next_release()
    }

    /// Earliest release time in the delay line.
    #[inline]
    pub fn next_release(&self) -> Option<u64> {
        self.delay_line.peek().map(|d| d.release)
    }

    /// Next packet whose release time has come.
    #[inline]
    pub fn pop_ready(&mut self, now: u64) -> Option<Packet> {
        self.pop_ready_at(now).map(|x| x.1)
    }

    /// Same, with its (virtual) release time.
    #[inline]
    pub fn pop_ready_at(&mut self, now: u64) -> Option<(u64, Packet)> {
        if self.delay_line.peek()?.release <= now {
            self.delay_line.pop().map(|d| (d.release, d.pkt))
        } else {
            None
        }
    }

    /// Stats with the gauges filled in.
    pub fn snapshot(&self) -> DirStats {
        let mut s = self.stats.clone();
        s.mean_queue_delay_us =
            if s.dequeued > 0 { (s.queue_delay_sum_ns as f64 / s.dequeued as f64) / 1000.0 } else { 0.0 };
        s.queued_packets = self.queue.len() as u64;
        s.in_flight_packets = self.delay_line.iter().map(|d| d.pkt.segs as u64).sum::<u64>()
            + self.in_service.as_ref().map_or(0, |s| s.pkt.segs as u64);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{JitterDist, LinkSettings, LossModel, Qdisc};
    use crate::trace::Trace;
    use std::sync::Arc;

    const MS: u64 = 1_000_000;

    fn link(s: LinkSettings) -> Link {
        Link::new(s.compile().unwrap(), 1, 0, 0)
    }

    fn frame(len: usize, tag: u32) -> Packet {
        let mut d = vec![0u8; len];
        d[14..18].copy_from_slice(&tag.to_be_bytes());
        Packet::new(d)
    }

    fn tag(p: &Packet) -> u32 {
        u32::from_be_bytes(p.data[14..18].try_into().unwrap())
    }

    /// Step a virtual clock in `step` ns increments until `until`, collecting (time, tag).
    fn run(l: &mut Link, from: u64, until: u64, step: u64) -> Vec<(u64, u32)> {
        let mut out = vec![];
        let mut t = from;
        while t <= until {
            l.advance(t);
            while let Some(p) = l.pop_ready(t) {
                out.push((t, tag(&p)));
            }
            t += step;
        }
        out
    }

    #[test]
    fn serialisation_timing() {
        // 12 Mbit/s: 1500 B = 1 ms on the wire; 5 back-to-back packets leave at 1..5 ms.
        let mut l = link(LinkSettings { rate_bps: 12_000_000, ..Default::default() });
        for i in 0..5 {
            l.ingress(frame(1500, i), 0);
        }
        let out = run(&mut l, 0, 10 * MS, 1000);
        let times: Vec<u64> = out.iter().map(|x| x.0).collect();
        assert_eq!(times, vec![MS, 2 * MS, 3 * MS, 4 * MS, 5 * MS]);
        // Queueing delay: the 5th waited 4 packet times.
        assert_eq!(l.stats.max_queue_delay_us, 4000.0);
        // Overhead bytes count on the wire: 1476 + 24 = 1500 B = 1 ms.
        let mut l = link(LinkSettings { rate_bps: 12_000_000, overhead_bytes: 24, ..Default::default() });
        l.ingress(frame(1476, 0), 0);
        assert_eq!(run(&mut l, 0, 2 * MS, 1000)[0].0, MS);
    }

    #[test]
    fn serialisation_is_exact_when_polled_late() {
        // Polling every 7 ms must not change virtual departure times (+delay).
        let mut l = link(LinkSettings { rate_bps: 12_000_000, delay_ms: 10.0, ..Default::default() });
        for i in 0..5 {
            l.ingress(frame(1500, i), 0);
        }
        let mut releases = vec![];
        let mut t = 0;
        while t < 40 * MS {
            l.advance(t);
            while let Some((r, _)) = l.pop_ready_at(t) {
                releases.push(r);
            }
            t += 7 * MS;
        }
        assert_eq!(releases, vec![11 * MS, 12 * MS, 13 * MS, 14 * MS, 15 * MS]);
    }

    #[test]
    fn a_loop_that_sleeps_until_next_due_releases_what_a_spinning_one_does() {
        // --block: the loop sleeps until next_due() unless a frame is queued or on the wire (then it polls).
        let mut l = link(LinkSettings { rate_bps: 12_000_000, delay_ms: 10.0, ..Default::default() });
        assert_eq!(l.next_due(), None);
        for i in 0..5 {
            l.ingress(frame(1500, i), 0);
        }
        let (mut releases, mut t, mut wakes) = (vec![], 0, 0);
        while t < 40 * MS {
            l.advance(t);
            while let Some((r, _)) = l.pop_ready_at(t) {
                releases.push(r);
            }
            wakes += 1;
            t = match l.next_due() {
                Some(0) => t + 10_000,
                Some(due) => due.max(t + 1),
                None => break,
            };
        }
        assert_eq!(releases, vec![11 * MS, 12 * MS, 13 * MS, 14 * MS, 15 * MS]);
        assert_eq!(l.next_due(), None); // all out: nothing left to wake for
        // Polled while the five serialise (5 ms at 10 us), then one wake per release at most.
        assert!(wakes <= 500 + 5 + 2, "{wakes}");
    }

    #[test]
    fn rate_throughput_long_run() {
        // Saturated 50 Mbit/s link: bytes out over 1 s = rate (within one packet).
        let mut l = link(LinkSettings { rate_bps: 50_000_000, buffer_packets: Some(100_000), ..Default::default() });
        for i in 0..10_000 {
            l.ingress(frame(1514, i), 0);
        }
        let out = run(&mut l, 0, 1_000 * MS, 10_000);
        let bytes = out.len() as f64 * 1514.0;
        let expect = 50e6 / 8.0;
        assert!((bytes - expect).abs() <= 1514.0, "{bytes} vs {expect}");
    }

    #[test]
    fn queue_delay_equals_buffer_over_rate_and_no_early_drop() {
        // 10 Mbit/s, 30 kB buffer: max queueing delay = 30000*8/10e6 = 24 ms
        // within one packet time (1.2 ms). Offer 20 Mbit/s for 1 s.
        let rate = 10_000_000u64;
        let buf = 30_000u64;
        let mut l = link(LinkSettings { rate_bps: rate, buffer_bytes: Some(buf), ..Default::default() });
        let mut t = 0;
        let mut i = 0;
        while t < 1_000 * MS {
            l.advance(t);
            // Before the first drop, the queue must be (nearly) full.
            let before = l.stats.dropped_queue;
            let qbytes = l.queue.bytes();
            l.ingress(frame(1500, i), t);
            if l.stats.dropped_queue > before {
                assert!(qbytes + 1500 > buf, "dropped with {qbytes} B queued");
            }
            while l.pop_ready(t).is_some() {}
            i += 1;
            t += 600_000; // 1500 B every 0.6 ms = 20 Mbit/s
        }
        let want_us = buf as f64 * 8.0 / rate as f64 * 1e6;
        let pkt_us = 1500.0 * 8.0 / rate as f64 * 1e6;
        let got = l.stats.max_queue_delay_us;
        assert!((got - want_us).abs() <= pkt_us, "max qdelay {got} us vs {want_us} us");
        assert!(l.stats.dropped_queue > 0);
    }

    #[test]
    fn fifo_without_reorder_on_jitter() {
        let mut l = link(LinkSettings {
            delay_ms: 10.0,
            jitter_ms: 5.0,
            jitter_dist: JitterDist::Normal,
            ..Default::default()
        });
        for i in 0..2000u32 {
            l.ingress(frame(100, i), i as u64 * 100_000);
            l.advance(i as u64 * 100_000);
        }
        let out = run(&mut l, 0, 400 * MS, 50_000);
        assert_eq!(out.len(), 2000);
        assert!(out.windows(2).all(|w| w[0].1 < w[1].1), "order must be kept");

        // With reorder_on_jitter some packets overtake others.
        let mut l =
            link(LinkSettings { delay_ms: 10.0, jitter_ms: 5.0, reorder_on_jitter: true, ..Default::default() });
        for i in 0..2000u32 {
            l.ingress(frame(100, i), i as u64 * 100_000);
            l.advance(i as u64 * 100_000);
        }
        let out = run(&mut l, 0, 400 * MS, 50_000);
        assert_eq!(out.len(), 2000);
        assert!(out.windows(2).any(|w| w[0].1 > w[1].1));
    }

    #[test]
    fn jitter_sd_through_link() {
        // Packets spaced far apart (100 ms) so FIFO clamping never applies.
        let mut l = link(LinkSettings { delay_ms: 50.0, jitter_ms: 2.0, ..Default::default() });
        let n = 20_000u64;
        let mut delays = vec![];
        for i in 0..n {
            let t = i * 100 * MS;
            l.ingress(frame(100, i as u32), t);
            l.advance(t);
            let r = l.next_release().unwrap();
            delays.push((r - t) as f64);
            l.pop_ready(u64::MAX);
        }
        let mean = delays.iter().sum::<f64>() / n as f64;
        let sd = (delays.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
        assert!((mean - 50.0 * MS as f64).abs() < 0.05 * MS as f64, "mean {mean}");
        assert!((sd - 2.0 * MS as f64).abs() < 0.1 * 2.0 * MS as f64, "sd {sd}");
    }

    #[test]
    fn loss_duplicate_corrupt_reorder_counts() {
        let mut l = link(LinkSettings {
            delay_ms: 10.0,
            loss: LossModel::Bernoulli { p: 0.1, correlation: 0.0 },
            duplicate: 0.05,
            corrupt: 0.02,
            reorder: 0.1,
            buffer_packets: Some(1_000_000),
            ..Default::default()
        });
        let n = 100_000u64;
        for i in 0..n {
            l.ingress(frame(200, i as u32), 0);
        }
        let s = l.stats.clone();
        let sig = |p: f64, n: f64| 3.0 * (p * (1.0 - p) * n).sqrt();
        assert!((s.lost as f64 - 0.1 * n as f64).abs() < sig(0.1, n as f64));
        let kept = (n - s.lost) as f64;
        assert!((s.duplicated as f64 - 0.05 * kept).abs() < sig(0.05, kept));
        assert!((s.corrupted as f64 - 0.02 * kept).abs() < sig(0.02, kept));
        let out = run(&mut l, 0, 20 * MS, MS);
        assert_eq!(out.len() as u64, n - s.lost + s.duplicated);
        // Reordered ones left at departure (t=0), the rest at 10 ms.
        let early = out.iter().filter(|x| x.0 < 10 * MS).count() as u64;
        assert_eq!(early, l.stats.reordered);
    }

    /// Offloaded frames go through whole when nothing tells their segments
    /// apart, and are split when something does: either way the decisions,
    /// counters and delivery times are those of the segments sent one by one.
    #[test]
    fn offloaded_frames_behave_as_their_segments() {
        use crate::packet::offloaded_tcp;
        let cases = [
            // Rate and a buffer that bursts of 8 frames overflow: the frames that fit go whole, the one
            // that fits in part is split.
            (8, LinkSettings { rate_bps: 1_000_000_000, buffer_bytes: Some(300_000), delay_ms: 5.0, ..Default::default() }),
            // Rare loss: most frames stay whole, a few are split.
            (1, LinkSettings {
                rate_bps: 2_000_000_000,
                buffer_packets: Some(10_000),
                loss: LossModel::Bernoulli { p: 0.0005, correlation: 0.0 },
                duplicate: 0.0002,
                reorder: 0.0002,
                delay_ms: 5.0,
                ..Default::default()
            }),
            // Gilbert-Elliott bursts and no rate limit.
            (1, LinkSettings {
                loss: LossModel::GilbertElliott { p: 0.001, r: 0.3, one_minus_h: 1.0, one_minus_k: 0.0 },
                delay_ms: 1.0,
                buffer_packets: Some(100_000),
                ..Default::default()
            }),
        ];
        for (burst, settings) in cases {
            let frames = |split: bool| {
                let mut out = vec![];
                for i in 0..400u64 {
                    let mut p = offloaded_tcp(i % 2 == 1, 60_000 + (i as usize % 7) * 700, 1448, 0x18);
                    assert!(p.parse_gso());
                    // 200 µs apart (2.4 Gbit/s offered), or bursts every 5 ms.
                    let t = if burst == 1 { i * 200_000 } else { i / burst * 5 * MS };
                    if split {
                        let mut segs = vec![];
                        segment(p, &mut Vec::new, &mut vec![], &mut segs);
                        out.extend(segs.into_iter().map(|s| (t, s)));
                    } else {
                        out.push((t, p));
                    }
                }
                out
            };
            let deliver = |split: bool| {
                let mut l = Link::new(settings.compile().unwrap(), 7, 0, 0);
                let mut released = vec![];
                let mut input = frames(split).into_iter().peekable();
                let mut t = 0;
                while t < 300 * MS {
                    while let Some((_, p)) = input.next_if(|(at, _)| *at <= t) {
                        l.ingress(p, t);
                    }
                    l.advance(t);
                    while let Some((r, p)) = l.pop_ready_at(t) {
                        released.push((r, p.segs as u64, p.wire_len()));
                    }
                    t += 10_000;
                }
                (l.snapshot(), released)
            };
            let (whole, out_whole) = deliver(false);
            let (split, out_split) = deliver(true);
            assert!(whole.offloaded_frames == 400 && split.offloaded_frames == 0);
            assert!(whole.segmented_frames > 0, "{settings:?}: no frame was split");

            for key in ["rx_packets", "rx_bytes", "lost", "duplicated", "reordered", "dropped_queue"] {
                let (a, b) = (serde_json::to_value(&whole).unwrap()[key].clone(), serde_json::to_value(&split).unwrap()[key].clone());
                assert_eq!(a, b, "{key} with {settings:?}");
            }
            assert_eq!(whole.max_queue_delay_us.round(), split.max_queue_delay_us.round());
            // When a whole frame is delivered, the same packets and bytes have been delivered in both runs
            // (a whole frame leaves with its last segment: in between, the split run is ahead by the
            // segments already out).
            let upto = |out: &Vec<(u64, u64, u64)>, t: u64| {
                out.iter().filter(|x| x.0 <= t).fold((0, 0), |acc, x| (acc.0 + x.1, acc.1 + x.2))
            };
            let mut whole_releases = 0;
            for &(t, segs, _) in &out_whole {
                if segs > 1 {
                    whole_releases += 1;
                    assert_eq!(upto(&out_whole, t), upto(&out_split, t), "at {t} with {settings:?}");
                }
            }
            assert!(whole_releases > 100, "{whole_releases} whole frames delivered");
            assert_eq!(upto(&out_whole, u64::MAX), upto(&out_split, u64::MAX));
        }
    }

    #[test]
    fn same_seed_same_loss_pattern() {
        let s = LinkSettings { loss: LossModel::Bernoulli { p: 0.2, correlation: 0.0 }, jitter_ms: 1.0, ..Default::default() };
        let pattern = |seed: u64, s: &LinkSettings| {
            let mut l = Link::new(s.compile().unwrap(), seed, 0, 0);
            (0..5000u32)
                .map(|i| {
                    let before = l.stats.lost;
                    l.ingress(frame(100, i), i as u64);
                    l.stats.lost > before
                })
                .collect::<Vec<bool>>()
        };
        assert_eq!(pattern(5, &s), pattern(5, &s));
        assert_ne!(pattern(5, &s), pattern(6, &s));
        // Turning jitter off does not change the loss pattern (separate streams).
        let s2 = LinkSettings { jitter_ms: 0.0, ..s.clone() };
        assert_eq!(pattern(5, &s), pattern(5, &s2));
    }

    #[test]
    fn rate_change_at_virtual_time() {
        // 12 Mbit/s then 24 Mbit/s applied at t=2.5 ms: the packet on the wire
        // (started at 2 ms, 0.5 ms done) finishes its remaining half at double speed.
        let mut l = link(LinkSettings { rate_bps: 12_000_000, ..Default::default() });
        for i in 0..5 {
            l.ingress(frame(1500, i), 0);
        }
        let mut out = run(&mut l, 0, 2_500_000, 100_000);
        let p = LinkSettings { rate_bps: 24_000_000, ..Default::default() }.compile().unwrap();
        l.set_params(p, 2_500_000);
        out.extend(run(&mut l, 2_600_000, 10 * MS, 100_000));
        let times: Vec<u64> = out.iter().map(|x| x.0).collect();
        assert_eq!(times, vec![MS, 2 * MS, 2_800_000, 3_300_000, 3_800_000]);
        // 2.75 ms exact for the third; polled at 100 µs steps -> 2.8 ms
    }

    #[test]
    fn trace_opportunities() {
        // Opportunities at 1, 1, 3 ms (period 3 ms). 4 full packets + a 3000 B one.
        let tr = Arc::new(Trace::parse("1\n1\n3\n", "t").unwrap());
        let mut p = LinkSettings::default().compile().unwrap();
        p.trace = Some(tr);
        let mut l = Link::new(p, 1, 0, 0);
        for i in 0..4 {
            l.ingress(frame(1500, i), 0);
        }
        let out = run(&mut l, 0, 4_400_000, 100_000);
        let times: Vec<u64> = out.iter().map(|x| x.0).collect();
        assert_eq!(times, vec![MS, MS, 3 * MS, 4 * MS]);
        // A packet arriving after an opportunity cannot use it: the next one is at 6 ms
        // (the trace loops: 4, 4, 6, 7, 7, 9, ...). Its unused 500 B are wasted.
        l.ingress(frame(1000, 9), 4_500_000);
        let out = run(&mut l, 4_500_000, 6_400_000, 100_000);
        assert_eq!(out.iter().map(|x| x.0).collect::<Vec<_>>(), vec![6 * MS]);
        // One opportunity carries 1500 B: 1000 B + the first 500 B of a 2000 B
        // packet at the first 7 ms opportunity, 1500 B more at the second one.
        l.ingress(frame(1000, 10), 6_500_000);
        l.ingress(frame(2000, 11), 6_500_000);
        let out = run(&mut l, 6_500_000, 20 * MS, 100_000);
        let times: Vec<u64> = out.iter().map(|x| x.0).collect();
        assert_eq!(times, vec![7 * MS, 7 * MS]);
    }

    #[test]
    fn codel_through_link() {
        let mut l = link(LinkSettings {
            rate_bps: 12_000_000,
            qdisc: Qdisc::Codel { target_ms: 5.0, interval_ms: 100.0 },
            buffer_packets: Some(100_000),
            ..Default::default()
        });
        // 2 packets per ms into a 1 packet/ms link for 1 s (an unresponsive
        // 2x overload: CoDel's control law only ramps up slowly, so we check
        // that it drops, and that every drop is its decision, not overflow).
        let mut t = 0;
        let mut i = 0;
        while t < 1_000 * MS {
            l.advance(t);
            l.ingress(frame(1500, i), t);
            l.ingress(frame(1500, i + 1), t);
            i += 2;
            while l.pop_ready(t).is_some() {}
            t += MS;
        }
        assert!(l.stats.dropped_aqm > 10, "{}", l.stats.dropped_aqm);
        assert_eq!(l.stats.dropped_aqm, l.stats.dropped_queue);
        // No drop before target (5 ms) was exceeded for an interval (100 ms):
        // with a 1 ms/packet growth the first drop cannot precede ~105 ms.
    }
}
