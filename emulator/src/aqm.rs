//! The bottleneck queue and its disciplines: drop-tail, drop-head, CoDel
//! (RFC 8289), RED (Floyd & Jacobson), PIE (RFC 8033) and fair queueing
//! (deficit round robin over flows). Pure: time is a parameter (ns), dropped
//! packets are handed back to the caller.

use std::collections::{HashMap, VecDeque};

use crate::config::Qdisc;
use crate::model::Rng;
use crate::packet::{flow_key, Packet};

/// Largest frame, used by CoDel/PIE's "don't drop when less than a packet is queued".
pub const MAX_FRAME: u64 = 1514;

#[derive(Debug, Clone, Default)]
struct CodelState {
    first_above_time: u64,
    drop_next: u64,
    count: u32,
    lastcount: u32,
    dropping: bool,
}

#[derive(Debug, Clone, Default)]
struct RedState {
    avg: f64,
    count: i64,
    idle_since: Option<u64>,
}

#[derive(Debug, Clone)]
struct PieState {
    prob: f64,
    qdelay_old: u64,
    qdelay: u64,
    burst_allowance: u64,
    last_update: u64,
    started: bool,
}

impl Default for PieState {
    fn default() -> Self {
        PieState { prob: 0.0, qdelay_old: 0, qdelay: 0, burst_allowance: PIE_MAX_BURST, last_update: 0, started: false }
    }
}

const PIE_TUPDATE: u64 = 15_000_000;
const PIE_MAX_BURST: u64 = 150_000_000;
const RED_WQ: f64 = 0.002;

/// Outcome of an enqueue.
#[derive(Debug, PartialEq, Eq)]
pub enum Enq {
    /// Dropped by the buffer limit.
    DroppedFull,
    /// Dropped by the AQM (RED/PIE early drop).
    DroppedAqm,
}

/// Fair queueing's flows: a FIFO each, the active ones served in turn, a
/// quantum of bytes per turn (deficit round robin). Invariant between calls:
/// the flow at the front of `active` has the deficit to send its head packet,
/// so the next packet out is known without serving (`peek`).
#[derive(Default)]
struct Flows {
    index: HashMap<Vec<u8>, usize>,
    queues: Vec<VecDeque<Packet>>,
    bytes: Vec<u64>,
    deficit: Vec<u64>,
    key: Vec<Vec<u8>>,
    active: VecDeque<usize>,
    free: Vec<usize>,
}

impl Flows {
    fn slot(&mut self, key: Vec<u8>) -> usize {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.queues.push(VecDeque::new());
                self.bytes.push(0);
                self.deficit.push(0);
                self.key.push(Vec::new());
                self.queues.len() - 1
            }
        };
        self.key[i] = key.clone();
        self.index.insert(key, i);
        i
    }

    fn push(&mut self, p: Packet, quantum: u64) {
        let i = self.slot(flow_key(&p.data));
        self.bytes[i] += p.wire_len();
        if self.queues[i].is_empty() {
            // A flow that was idle joins at the back with one quantum: it does not
            // keep credit from before (DRR's rule for an emptied queue).
            self.deficit[i] = quantum;
            self.active.push_back(i);
        }
        self.queues[i].push_back(p);
        self.settle(quantum);
    }

    /// Turn the round until the front flow may send its head packet.
    fn settle(&mut self, quantum: u64) {
        while let Some(&i) = self.active.front() {
            let need = self.queues[i].front().map_or(0, |p| p.wire_len());
            if self.deficit[i] >= need {
                return;
            }
            self.deficit[i] += quantum;
            self.active.rotate_left(1);
        }
    }

    fn peek(&self) -> Option<&Packet> {
        self.queues[*self.active.front()?].front()
    }

    fn pop(&mut self, quantum: u64) -> Option<Packet> {
        let i = *self.active.front()?;
        let p = self.queues[i].pop_front()?;
        self.bytes[i] -= p.wire_len();
        self.deficit[i] = self.deficit[i].saturating_sub(p.wire_len());
        if self.queues[i].is_empty() {
            self.active.pop_front();
            self.release(i);
        }
        self.settle(quantum);
        Some(p)
    }

    /// The head packet of the flow that holds the most bytes (ties: the
    /// first in the round), taken out to make room.
    fn pop_fattest(&mut self, quantum: u64) -> Option<Packet> {
        let (at, &i) = self.active.iter().enumerate().max_by_key(|(at, &i)| (self.bytes[i], std::cmp::Reverse(*at)))?;
        let p = self.queues[i].pop_front()?;
        self.bytes[i] -= p.wire_len();
        if self.queues[i].is_empty() {
            self.active.remove(at);
            self.release(i);
        }
        self.settle(quantum);
        Some(p)
    }

    fn release(&mut self, i: usize) {
        self.index.remove(&self.key[i]);
        self.bytes[i] = 0;
        self.deficit[i] = 0;
        self.free.push(i);
    }
}

pub struct Queue {
    q: VecDeque<Packet>,
    /// Of fair queueing: its flows (`q` stays empty).
    flows: Flows,
    /// Wire bytes and segments queued (an offloaded frame counts each of its segments).
    bytes: u64,
    segs: u64,
    pub limit_bytes: u64,
    pub limit_packets: u64,
    pub kind: Qdisc,
    codel: CodelState,
    red: RedState,
    pie: PieState,
    /// Packets dropped inside the queue (drop-head victims, CoDel drops),
    /// to be counted and recycled by the caller.
    pub dropped: Vec<Packet>,
    /// How many of `dropped` were AQM decisions (vs. buffer overflow).
    pub aqm_dropped: u64,
    /// Wire bytes and segments of the offloaded frame in service that have not
    /// started on the wire yet: still in the buffer, segment by segment (set by
    /// the link before each arrival).
    pub backlog: (u64, u64),
}

impl Queue {
    pub fn new(kind: Qdisc, limit_bytes: u64, limit_packets: u64) -> Self {
        Queue {
            q: VecDeque::with_capacity(1024),
            flows: Flows::default(),
            bytes: 0,
            segs: 0,
            limit_bytes,
            limit_packets,
            kind,
            codel: CodelState::default(),
            red: RedState::default(),
            pie: PieState::default(),
            dropped: Vec::new(),
            aqm_dropped: 0,
            backlog: (0, 0),
        }
    }

    /// Change discipline/limits at run time; the AQM state restarts when the kind changes.
    pub fn reconfigure(&mut self, kind: Qdisc, limit_bytes: u64, limit_packets: u64) {
        let was_fq = matches!(self.kind, Qdisc::Fq { .. });
        if std::mem::discriminant(&kind) != std::mem::discriminant(&self.kind) {
            self.codel = CodelState::default();
            self.red = RedState::default();
            self.pie = PieState::default();
        }
        // Into or out of fair queueing, the queued packets move to the other
        // structure, oldest first (their arrival order across flows).
        let moving = if was_fq != matches!(kind, Qdisc::Fq { .. }) { self.drain_all() } else { Vec::new() };
        self.kind = kind;
        self.limit_bytes = limit_bytes;
        self.limit_packets = limit_packets;
        let mut moving = moving;
        moving.sort_by_key(|p| p.arrival);
        for p in moving {
            self.push(p);
        }
    }

    /// Packets queued, each segment of an offloaded frame counted.
    pub fn len(&self) -> usize {
        self.segs as usize
    }
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    pub fn peek(&self) -> Option<&Packet> {
        match self.kind {
            Qdisc::Fq { .. } => self.flows.peek(),
            _ => self.q.front(),
        }
    }

    fn quantum(&self) -> u64 {
        match self.kind {
            Qdisc::Fq { quantum } => quantum,
            _ => MAX_FRAME,
        }
    }

    fn fits(&self, extra_bytes: u64, extra_segs: u64) -> bool {
        self.bytes + self.backlog.0 + extra_bytes <= self.limit_bytes
            && self.segs + self.backlog.1 + extra_segs <= self.limit_packets
    }

    /// Would `p` be refused for lack of room (drop-tail)? The link then splits an
    /// offloaded frame, so that the segments that fit are queued and the rest dropped.
    pub fn would_overflow(&self, p: &Packet) -> bool {
        !self.fits(p.wire_len(), p.segs as u64)
    }

    fn push(&mut self, p: Packet) {
        self.bytes += p.wire_len();
        self.segs += p.segs as u64;
        match self.kind {
            Qdisc::Fq { quantum } => self.flows.push(p, quantum),
            _ => self.q.push_back(p),
        }
    }

    fn pop(&mut self) -> Option<Packet> {
        let p = match self.kind {
            Qdisc::Fq { quantum } => self.flows.pop(quantum)?,
            _ => self.q.pop_front()?,
        };
        self.bytes -= p.wire_len();
        self.segs -= p.segs as u64;
        Some(p)
    }

    /// Every packet queued, in no order (a change of discipline re-queues them).
    fn drain_all(&mut self) -> Vec<Packet> {
        let mut out: Vec<Packet> = self.q.drain(..).collect();
        let quantum = self.quantum();
        while let Some(p) = self.flows.pop(quantum) {
            out.push(p);
        }
        self.bytes = 0;
        self.segs = 0;
        out
    }

    /// Offer a packet at time `now`. A refused packet is returned in Err.
    /// `rate_bps` is the current service rate (for RED's idle decay), 0 if unknown.
    pub fn enqueue(&mut self, p: Packet, now: u64, rng: &mut Rng, rate_bps: u64) -> Result<(), (Packet, Enq)> {
        let (len, segs) = (p.wire_len(), p.segs as u64);
        match self.kind.clone() {
            Qdisc::DropTail | Qdisc::Codel { .. } => {
                if !self.fits(len, segs) {
                    return Err((p, Enq::DroppedFull));
                }
            }
            Qdisc::DropHead => {
                while !self.fits(len, segs) {
                    match self.pop() {
                        Some(v) => self.dropped.push(v),
                        None => return Err((p, Enq::DroppedFull)),
                    }
                }
            }
            Qdisc::Red { min_bytes, max_bytes, p_max } => {
                let r = &mut self.red;
                if self.q.is_empty() {
                    // Idle-time decay: as if m small packets had arrived to an empty queue.
                    if let (Some(since), true) = (r.idle_since, rate_bps > 0) {
                        let pkt_ns = (MAX_FRAME * 8 * 1_000_000_000 / rate_bps).max(1);
                        let m = (now.saturating_sub(since) / pkt_ns) as f64;
                        r.avg *= (1.0 - RED_WQ).powf(m);
                    }
                    r.idle_since = None;
                }
                r.avg = (1.0 - RED_WQ) * r.avg + RED_WQ * self.bytes as f64;
                let (minb, maxb) = (min_bytes as f64, max_bytes as f64);
                if r.avg >= maxb {
                    r.count = 0;
                    return Err((p, Enq::DroppedAqm));
                } else if r.avg >= minb {
                    r.count += 1;
                    let pb = p_max * (r.avg - minb) / (maxb - minb);
                    let denom = 1.0 - r.count as f64 * pb;
                    let pa = if denom <= 0.0 { 1.0 } else { (pb / denom).min(1.0) };
                    if rng.chance(pa) {
                        r.count = 0;
                        return Err((p, Enq::DroppedAqm));
                    }
                } else {
                    r.count = -1;
                }
                if !self.fits(len, segs) {
                    return Err((p, Enq::DroppedFull));
                }
            }
            Qdisc::Fq { quantum } => {
                // Bigger than the whole buffer: refused. Otherwise in, and the
                // fattest flow pays for the room (its head goes), which may be
                // the arriving packet's own flow.
                if len > self.limit_bytes || segs > self.limit_packets {
                    return Err((p, Enq::DroppedFull));
                }
                self.push(p);
                while !self.fits(0, 0) {
                    match self.flows.pop_fattest(quantum) {
                        Some(v) => {
                            self.bytes -= v.wire_len();
                            self.segs -= v.segs as u64;
                            self.dropped.push(v);
                        }
                        None => break,
                    }
                }
                return Ok(());
            }
            Qdisc::Pie { target_ms } => {
                let target = crate::config::ms_to_ns(target_ms);
                self.pie_update(now, target);
                let s = &self.pie;
                let early_ok =
                    s.burst_allowance > 0 || (s.qdelay_old < target / 2 && s.prob < 0.2) || self.bytes <= 2 * MAX_FRAME;
                if !early_ok && rng.chance(self.pie.prob) {
                    return Err((p, Enq::DroppedAqm));
                }
                if !self.fits(len, segs) {
                    return Err((p, Enq::DroppedFull));
                }
            }
        }
        self.push(p);
        Ok(())
    }

    fn pie_update(&mut self, now: u64, target: u64) {
        let s = &mut self.pie;
        if !s.started {
            s.started = true;
            s.last_update = now;
            return;
        }
        while now >= s.last_update + PIE_TUPDATE {
            s.last_update += PIE_TUPDATE;
            let qd = if self.q.is_empty() { 0 } else { s.qdelay };
            let (a, b) = (0.125, 1.25);
            let mut delta = a * (qd as f64 - target as f64) / 1e9 + b * (qd as f64 - s.qdelay_old as f64) / 1e9;
            let scale = if s.prob < 1e-6 {
                1.0 / 2048.0
            } else if s.prob < 1e-5 {
                1.0 / 512.0
            } else if s.prob < 1e-4 {
                1.0 / 128.0
            } else if s.prob < 1e-3 {
                1.0 / 32.0
            } else if s.prob < 1e-2 {
                1.0 / 8.0
            } else if s.prob < 1e-1 {
                1.0 / 2.0
            } else {
                1.0
            };
            delta *= scale;
            if s.prob >= 0.1 && delta > 0.02 {
                delta = 0.02;
            }
            s.prob = (s.prob + delta).clamp(0.0, 1.0);
            if qd == 0 && s.qdelay_old == 0 {
                s.prob *= 0.98;
            }
            s.burst_allowance = s.burst_allowance.saturating_sub(PIE_TUPDATE);
            if s.prob == 0.0 && qd < target / 2 && s.qdelay_old < target / 2 {
                s.burst_allowance = PIE_MAX_BURST;
            }
            s.qdelay_old = qd;
        }
    }

    /// Take the head packet for transmission starting at `now` (AQMs drop
    /// here; victims go to `dropped`).
    pub fn dequeue(&mut self, now: u64) -> Option<Packet> {
        match self.kind.clone() {
            Qdisc::Codel { target_ms, interval_ms } => {
                let target = crate::config::ms_to_ns(target_ms);
                let interval = crate::config::ms_to_ns(interval_ms).max(1);
                self.codel_dequeue(now, target, interval)
            }
            Qdisc::Pie { target_ms } => {
                let p = self.pop();
                if let Some(p) = &p {
                    self.pie.qdelay = now.saturating_sub(p.arrival);
                }
                self.pie_update(now, crate::config::ms_to_ns(target_ms));
                p
            }
            Qdisc::Red { .. } => {
                let p = self.pop();
                if self.q.is_empty() {
                    self.red.idle_since = Some(now);
                }
                p
            }
            _ => self.pop(),
        }
    }

    fn codel_do_dequeue(&mut self, now: u64, target: u64, interval: u64) -> (Option<Packet>, bool) {
        let p = match self.pop() {
            None => {
                self.codel.first_above_time = 0;
                return (None, false);
            }
            Some(p) => p,
        };
        let sojourn = now.saturating_sub(p.arrival);
        let mut ok_to_drop = false;
        if sojourn < target || self.bytes <= MAX_FRAME {
            self.codel.first_above_time = 0;
        } else if self.codel.first_above_time == 0 {
            self.codel.first_above_time = now + interval;
        } else if now >= self.codel.first_above_time {
            ok_to_drop = true;
        }
        (Some(p), ok_to_drop)
    }

    fn control_law(t: u64, interval: u64, count: u32) -> u64 {
        t + (interval as f64 / (count.max(1) as f64).sqrt()) as u64
    }

    fn codel_dequeue(&mut self, now: u64, target: u64, interval: u64) -> Option<Packet> {
        let (mut p, mut ok) = self.codel_do_dequeue(now, target, interval);
        if p.is_none() {
            self.codel.dropping = false;
            return None;
        }
        if self.codel.dropping {
            if !ok {
                self.codel.dropping = false;
            }
            while self.codel.dropping && now >= self.codel.drop_next {
                if let Some(v) = p.take() {
                    self.dropped.push(v);
                    self.aqm_dropped += 1;
                }
                self.codel.count += 1;
                let (np, nok) = self.codel_do_dequeue(now, target, interval);
                p = np;
                ok = nok;
                if !ok {
                    self.codel.dropping = false;
                } else {
                    self.codel.drop_next = Self::control_law(self.codel.drop_next, interval, self.codel.count);
                }
            }
        } else if ok {
            if let Some(v) = p.take() {
                self.dropped.push(v);
                self.aqm_dropped += 1;
            }
            let (np, _) = self.codel_do_dequeue(now, target, interval);
            p = np;
            self.codel.dropping = true;
            let delta = self.codel.count.saturating_sub(self.codel.lastcount);
            self.codel.count =
                if delta > 1 && now.saturating_sub(self.codel.drop_next) < 16 * interval { delta } else { 1 };
            self.codel.drop_next = Self::control_law(now, interval, self.codel.count);
            self.codel.lastcount = self.codel.count;
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{stream, Rng};

    fn pkt(len: usize, t: u64) -> Packet {
        let mut p = Packet::new(vec![0u8; len]);
        p.arrival = t;
        p
    }

    /// An IPv4/UDP frame of `len` bytes from port `sport`, arrived at `t`.
    fn udp(len: usize, sport: u16, t: u64) -> Packet {
        let mut d = vec![0u8; len];
        d[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        d[14] = 0x45;
        d[23] = 17;
        d[26..30].copy_from_slice(&[198, 18, 0, 2]);
        d[30..34].copy_from_slice(&[198, 18, 0, 3]);
        d[34..36].copy_from_slice(&sport.to_be_bytes());
        d[36..38].copy_from_slice(&5201u16.to_be_bytes());
        let mut p = Packet::new(d);
        p.arrival = t;
        p
    }

    fn sport(p: &Packet) -> u16 {
        u16::from_be_bytes([p.data[34], p.data[35]])
    }

    const FQ: Qdisc = Qdisc::Fq { quantum: 1514 };

    #[test]
    fn fq_serves_the_flows_in_turn() {
        let mut rng = Rng::new(0, 0, stream::AQM);
        let mut q = Queue::new(FQ, u64::MAX, u64::MAX);
        for i in 0..10 {
            q.enqueue(udp(1500, 1, i), i, &mut rng, 0).unwrap();
        }
        q.enqueue(udp(1500, 2, 10), 10, &mut rng, 0).unwrap();
        q.enqueue(udp(1500, 3, 11), 11, &mut rng, 0).unwrap();
        // The newcomers do not wait behind the first flow's ten packets.
        let order: Vec<u16> = (0..6).map(|t| sport(&q.dequeue(100 + t).unwrap())).collect();
        assert_eq!(order, vec![1, 2, 3, 1, 1, 1]);
        assert_eq!(q.len(), 6);
        assert_eq!(sport(q.peek().unwrap()), 1);
    }

    #[test]
    fn fq_shares_bytes_not_packets() {
        // A flow of 1500-byte packets and one of 300-byte packets, both always
        // backlogged: each gets the same bytes of service, within a quantum.
        let mut rng = Rng::new(0, 0, stream::AQM);
        let mut q = Queue::new(FQ, u64::MAX, u64::MAX);
        let mut served = [0u64; 2];
        for t in 0..2000u64 {
            while q.len() < 40 {
                q.enqueue(udp(1500, 1, t), t, &mut rng, 0).unwrap();
                for _ in 0..5 {
                    q.enqueue(udp(300, 2, t), t, &mut rng, 0).unwrap();
                }
            }
            let p = q.dequeue(t).unwrap();
            served[(sport(&p) - 1) as usize] += p.wire_len();
        }
        let (a, b) = (served[0] as f64, served[1] as f64);
        assert!((a - b).abs() <= 2.0 * 1514.0, "served {a} and {b} bytes");
    }

    #[test]
    fn fq_makes_room_from_the_fattest_flow() {
        let mut rng = Rng::new(0, 0, stream::AQM);
        let mut q = Queue::new(FQ, 4500, u64::MAX);
        for i in 0..3 {
            q.enqueue(udp(1500, 1, i), i, &mut rng, 0).unwrap();
        }
        // A second flow's packet is queued; the first flow's oldest makes room.
        q.enqueue(udp(1500, 2, 3), 3, &mut rng, 0).unwrap();
        assert_eq!(q.dropped.len(), 1);
        assert_eq!((sport(&q.dropped[0]), q.dropped[0].arrival), (1, 0));
        assert_eq!((q.len(), q.bytes()), (3, 4500));
        // Flow 1 still holds the most: its next arrival pushes its own head out.
        q.enqueue(udp(1500, 1, 4), 4, &mut rng, 0).unwrap();
        assert_eq!((sport(&q.dropped[1]), q.dropped[1].arrival), (1, 1));
        let out: Vec<(u16, u64)> = (0..3).map(|t| q.dequeue(10 + t).map(|p| (sport(&p), p.arrival)).unwrap()).collect();
        assert_eq!(out, vec![(1, 2), (2, 3), (1, 4)]);
        assert!(q.dequeue(20).is_none() && q.peek().is_none());
        // Bigger than the whole buffer: refused.
        assert_eq!(q.enqueue(udp(5000, 3, 21), 21, &mut rng, 0).unwrap_err().1, Enq::DroppedFull);
        // An emptied flow's slot is reused, and nothing is left behind.
        assert!(q.flows.index.is_empty() && q.flows.active.is_empty());
    }

    #[test]
    fn fq_to_and_from_fifo_keeps_every_packet() {
        let mut rng = Rng::new(0, 0, stream::AQM);
        let mut q = Queue::new(Qdisc::DropTail, u64::MAX, u64::MAX);
        for (i, port) in [1u16, 1, 2, 1, 2].iter().enumerate() {
            q.enqueue(udp(1000, *port, i as u64), i as u64, &mut rng, 0).unwrap();
        }
        q.reconfigure(FQ, u64::MAX, u64::MAX);
        assert_eq!((q.len(), q.bytes()), (5, 5000));
        let first: Vec<u64> = (0..2).map(|t| q.dequeue(t).unwrap().arrival).collect();
        assert_eq!(first, vec![0, 2]); // flow 1's head, then flow 2's
        q.reconfigure(Qdisc::DropTail, u64::MAX, u64::MAX);
        let rest: Vec<u64> = (0..3).map(|t| q.dequeue(t).unwrap().arrival).collect();
        assert_eq!(rest, vec![1, 3, 4]); // oldest first again
        assert_eq!((q.len(), q.bytes()), (0, 0));
    }

    #[test]
    fn drop_tail_drops_only_when_full() {
        let mut rng = Rng::new(0, 0, stream::AQM);
        let mut q = Queue::new(Qdisc::DropTail, 4500, u64::MAX);
        for i in 0..3 {
            assert!(q.enqueue(pkt(1500, i), i, &mut rng, 0).is_ok(), "packet {i} must fit");
        }
        assert_eq!(q.bytes(), 4500);
        let e = q.enqueue(pkt(1500, 3), 3, &mut rng, 0).unwrap_err();
        assert_eq!(e.1, Enq::DroppedFull);
        // A smaller one still does not fit; after a dequeue a full one fits again.
        assert!(q.enqueue(pkt(100, 4), 4, &mut rng, 0).is_err());
        assert_eq!(q.dequeue(5).unwrap().arrival, 0);
        assert!(q.enqueue(pkt(1500, 6), 6, &mut rng, 0).is_ok());
        // Packet limit.
        let mut q = Queue::new(Qdisc::DropTail, u64::MAX, 2);
        assert!(q.enqueue(pkt(60, 0), 0, &mut rng, 0).is_ok());
        assert!(q.enqueue(pkt(60, 0), 0, &mut rng, 0).is_ok());
        assert!(q.enqueue(pkt(60, 0), 0, &mut rng, 0).is_err());
    }

    #[test]
    fn drop_head_drops_oldest() {
        let mut rng = Rng::new(0, 0, stream::AQM);
        let mut q = Queue::new(Qdisc::DropHead, 3000, u64::MAX);
        for i in 0..4 {
            assert!(q.enqueue(pkt(1000, i), i, &mut rng, 0).is_ok());
        }
        assert_eq!(q.dropped.len(), 1);
        assert_eq!(q.dropped[0].arrival, 0);
        assert_eq!(q.len(), 3);
        assert_eq!(q.dequeue(10).unwrap().arrival, 1);
        // Bigger than the whole buffer: refused.
        assert!(q.enqueue(pkt(4000, 5), 5, &mut rng, 0).is_err());
    }

    #[test]
    fn codel_drops_after_target_exceeded_for_interval() {
        // Queue fed faster than it is served: sojourn grows beyond target.
        let ms = 1_000_000u64;
        let mut rng = Rng::new(0, 0, stream::AQM);
        let mut q = Queue::new(Qdisc::Codel { target_ms: 5.0, interval_ms: 100.0 }, u64::MAX, u64::MAX);
        // 2 arrivals per ms, 1 departure per ms (1500 B packets).
        let mut first_drop_at = None;
        let mut above_since = None;
        for t in 0..400u64 {
            let now = t * ms;
            q.enqueue(pkt(1500, now), now, &mut rng, 0).unwrap();
            q.enqueue(pkt(1500, now), now, &mut rng, 0).unwrap();
            let before = q.dropped.len();
            let p = q.dequeue(now).unwrap();
            let sojourn = now - p.arrival;
            if sojourn >= 5 * ms && above_since.is_none() {
                above_since = Some(now);
            }
            if q.dropped.len() > before && first_drop_at.is_none() {
                first_drop_at = Some(now);
            }
        }
        let (above, first) = (above_since.unwrap(), first_drop_at.expect("codel must drop"));
        // No drop before target has been exceeded for a full interval.
        assert!(first >= above + 100 * ms, "first drop {first} above since {above}");
        assert!(first <= above + 102 * ms, "first drop {first} above since {above}");
        assert!(q.aqm_dropped > 1);
    }

    #[test]
    fn codel_no_drop_below_target() {
        let ms = 1_000_000u64;
        let mut rng = Rng::new(0, 0, stream::AQM);
        let mut q = Queue::new(Qdisc::Codel { target_ms: 5.0, interval_ms: 100.0 }, u64::MAX, u64::MAX);
        for t in 0..1000u64 {
            let now = t * ms;
            for _ in 0..3 {
                q.enqueue(pkt(1500, now), now, &mut rng, 0).unwrap();
            }
            // served 4 ms later: sojourn ~4ms < 5ms target
            while let Some(h) = q.peek() {
                if h.arrival + 4 * ms <= now {
                    q.dequeue(now);
                } else {
                    break;
                }
            }
        }
        assert_eq!(q.dropped.len(), 0);
    }

    #[test]
    fn red_drops_early_between_thresholds() {
        let mut rng = Rng::new(1, 0, stream::AQM);
        let mut q = Queue::new(Qdisc::Red { min_bytes: 30_000, max_bytes: 90_000, p_max: 0.1 }, 400_000, u64::MAX);
        let mut early = 0;
        let mut full = 0;
        for i in 0..20_000u64 {
            match q.enqueue(pkt(1500, i), i, &mut rng, 0) {
                Ok(()) => {}
                Err((_, Enq::DroppedAqm)) => early += 1,
                Err((_, Enq::DroppedFull)) => full += 1,
            }
            if i % 2 == 0 {
                q.dequeue(i);
            }
        }
        assert!(early > 0);
        assert_eq!(full, 0, "RED should keep the queue below the hard limit");
        // The queue hovers around max_bytes (plus the average's lag), far below the hard limit.
        assert!(q.bytes() < 200_000, "{}", q.bytes());
    }

    #[test]
    fn pie_controls_delay() {
        // 2 arrivals per ms, 1 departure per ms: PIE must start dropping and keep
        // the queue far below the (huge) buffer.
        let ms = 1_000_000u64;
        let mut rng = Rng::new(2, 0, stream::AQM);
        let mut q = Queue::new(Qdisc::Pie { target_ms: 15.0 }, u64::MAX, u64::MAX);
        let mut drops = 0;
        for t in 0..20_000u64 {
            let now = t * ms;
            for _ in 0..2 {
                if q.enqueue(pkt(1500, now), now, &mut rng, 0).is_err() {
                    drops += 1;
                }
            }
            q.dequeue(now);
        }
        assert!(drops > 5000, "drops {drops}");
        // queueing delay (1 ms per packet) should hover around the target, well below 200 ms
        assert!(q.len() < 200, "len {}", q.len());
    }
}
