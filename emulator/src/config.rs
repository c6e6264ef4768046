//! Link conditions as data: the JSON schema (serde), validation with errors a
//! person can act on, partial updates (used by the config file's sections, the
//! schedule and the control channel alike) and compilation into the numbers
//! the packet path uses.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::trace::Trace;

/// Queue discipline of the bottleneck queue.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Qdisc {
    /// Drop the arriving packet when the buffer is full (default).
    DropTail,
    /// Drop packets at the head of the queue to make room for the arriving one.
    DropHead,
    /// CoDel (RFC 8289) on top of the buffer limit.
    Codel {
        #[serde(default = "default_codel_target")]
        target_ms: f64,
        #[serde(default = "default_codel_interval")]
        interval_ms: f64,
    },
    /// Classic RED (Floyd & Jacobson 1993) on the average queue in bytes, on
    /// top of the buffer limit.
    Red {
        min_bytes: u64,
        max_bytes: u64,
        #[serde(default = "default_red_pmax")]
        p_max: f64,
    },
    /// PIE (RFC 8033) on top of the buffer limit.
    Pie {
        #[serde(default = "default_pie_target")]
        target_ms: f64,
    },
    /// Fair queueing: a FIFO per flow (its 5-tuple), served by deficit round
    /// robin (Shreedhar & Varghese 1995) a quantum of bytes at a time; the buffer
    /// limit is shared, and a full buffer drops from the head of the flow that
    /// holds the most bytes (as fq_codel does).
    Fq {
        #[serde(default = "default_fq_quantum")]
        quantum: u64,
    },
}

fn default_codel_target() -> f64 {
    5.0
}
fn default_codel_interval() -> f64 {
    100.0
}
fn default_red_pmax() -> f64 {
    0.1
}
fn default_pie_target() -> f64 {
    15.0
}
fn default_fq_quantum() -> u64 {
    1514
}

/// Jitter distribution (netem's names).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum JitterDist {
    /// Uniform on [-jitter, +jitter] (netem's default; sd = jitter/sqrt(3)).
    Uniform,
    /// Normal with standard deviation = jitter.
    Normal,
    /// Pareto (alpha = 3, like netem's table) shifted to mean 0 and scaled to sd = jitter.
    Pareto,
    /// 0.25 normal + 0.75 pareto (like netem's table), scaled to sd = jitter.
    Paretonormal,
}

/// Loss model at ingress.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "model", rename_all = "snake_case", deny_unknown_fields)]
pub enum LossModel {
    None,
    /// Independent loss with probability p; with `correlation`, netem's
    /// correlated draws (`loss random P C`, see model::Correlated).
    Bernoulli {
        p: f64,
        #[serde(default)]
        correlation: f64,
    },
    /// netem `gemodel p r 1-h 1-k`: Good->Bad with p, Bad->Good with r, loss
    /// probability 1-h in Bad and 1-k in Good.
    GilbertElliott {
        p: f64,
        r: f64,
        #[serde(default = "one")]
        one_minus_h: f64,
        #[serde(default)]
        one_minus_k: f64,
    },
}

fn one() -> f64 {
    1.0
}

/// Conditions of one direction. Every field has a default, so `{}` is a
/// transparent link (no rate limit, no delay, 1000-packet buffer).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LinkSettings {
    /// Bottleneck rate in bits/s; 0 = unlimited.
    pub rate_bps: u64,
    /// Bytes added to every frame for serialisation only (e.g. 24 = preamble
    /// 8 + IFG 12 + FCS 4). Default 0: only the Ethernet frame as received
    /// (header + payload, no FCS) is counted.
    pub overhead_bytes: u32,
    /// Mahimahi trace file: each line is a millisecond timestamp at which one
    /// 1500-byte delivery opportunity occurs; the trace loops. When set it
    /// replaces `rate_bps`.
    pub trace_file: Option<String>,
    /// Buffer limit in bytes (frame bytes) of the bottleneck queue.
    pub buffer_bytes: Option<u64>,
    /// Buffer limit in packets. When neither limit is set, 1000 packets (netem's default).
    pub buffer_packets: Option<u64>,
    pub qdisc: Qdisc,
    /// Fixed one-way propagation delay in milliseconds.
    pub delay_ms: f64,
    /// Jitter in milliseconds (see `jitter_dist`).
    pub jitter_ms: f64,
    pub jitter_dist: JitterDist,
    /// false (default): packets keep FIFO order, release = max(own, previous release).
    pub reorder_on_jitter: bool,
    pub loss: LossModel,
    /// Probability that a packet skips delay and jitter (netem `reorder`).
    pub reorder: f64,
    /// netem's correlation of the reorder draws (`reorder P C`).
    pub reorder_correlation: f64,
    /// Probability that a packet is duplicated.
    pub duplicate: f64,
    /// Probability that one random bit after the Ethernet header is flipped.
    pub corrupt: f64,
}

impl Default for LinkSettings {
    fn default() -> Self {
        LinkSettings {
            rate_bps: 0,
            overhead_bytes: 0,
            trace_file: None,
            buffer_bytes: None,
            buffer_packets: None,
            qdisc: Qdisc::DropTail,
            delay_ms: 0.0,
            jitter_ms: 0.0,
            jitter_dist: JitterDist::Normal,
            reorder_on_jitter: false,
            loss: LossModel::None,
            reorder: 0.0,
            reorder_correlation: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
        }
    }
}

/// A partial change to both directions: `both` first, then the per-direction
/// sections. Each section is a JSON object holding any subset of the
/// `LinkSettings` keys; nested objects (`qdisc`, `loss`) are replaced whole.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Update {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub both: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_to_b: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b_to_a: Option<Map<String, Value>>,
}

/// One schedule step: applied `at_ms` after the emulator printed "ready".
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScheduleStep {
    pub at_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub both: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_to_b: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b_to_a: Option<Map<String, Value>>,
}

impl ScheduleStep {
    pub fn update(&self) -> Update {
        Update { both: self.both.clone(), a_to_b: self.a_to_b.clone(), b_to_a: self.b_to_a.clone() }
    }
}

/// The config file.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// RNG seed (loss, duplicate, corrupt, reorder, jitter, AQM draws).
    #[serde(default)]
    pub seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub both: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_to_b: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b_to_a: Option<Map<String, Value>>,
    #[serde(default)]
    pub schedule: Vec<ScheduleStep>,
}

impl Config {
    pub fn parse(text: &str) -> Result<Config, String> {
        let cfg: Config = serde_json::from_str(text).map_err(|e| format!("config: {e}"))?;
        for (i, s) in cfg.schedule.iter().enumerate() {
            if !(s.at_ms.is_finite() && s.at_ms >= 0.0) {
                return Err(format!("config: schedule[{i}].at_ms must be a number >= 0"));
            }
        }
        Ok(cfg)
    }

    /// Initial settings of both directions (defaults + both + per direction).
    pub fn initial(&self) -> Result<(LinkSettings, LinkSettings), String> {
        let up = Update { both: self.both.clone(), a_to_b: self.a_to_b.clone(), b_to_a: self.b_to_a.clone() };
        let d = LinkSettings::default();
        up.apply(&d, &d, "config")
    }

    /// Schedule steps sorted by time (stable for equal times), each validated
    /// against the settings it will be applied to.
    pub fn sorted_schedule(&self) -> Result<Vec<ScheduleStep>, String> {
        let mut s = self.schedule.clone();
        s.sort_by(|x, y| x.at_ms.partial_cmp(&y.at_ms).unwrap());
        let (mut ab, mut ba) = self.initial()?;
        for (i, st) in s.iter().enumerate() {
            let ctx = format!("schedule step {i} (at_ms {})", st.at_ms);
            let (nab, nba) = st.update().apply(&ab, &ba, &ctx)?;
            // Loads (and caches) trace files now rather than on the packet path.
            nab.compile().map_err(|e| format!("{ctx}: a_to_b: {e}"))?;
            nba.compile().map_err(|e| format!("{ctx}: b_to_a: {e}"))?;
            ab = nab;
            ba = nba;
        }
        Ok(s)
    }
}

/// Merge a partial object into settings; errors name the offending key.
pub fn merge(cur: &LinkSettings, partial: &Map<String, Value>, ctx: &str) -> Result<LinkSettings, String> {
    let mut v = serde_json::to_value(cur).expect("settings serialise");
    let obj = v.as_object_mut().expect("settings are an object");
    for (k, val) in partial {
        if !obj.contains_key(k) {
            let keys: Vec<&String> = obj.keys().collect();
            return Err(format!("{ctx}: unknown key '{k}' (known keys: {keys:?})"));
        }
        obj.insert(k.clone(), val.clone());
    }
    let s: LinkSettings = serde_json::from_value(v).map_err(|e| format!("{ctx}: {e}"))?;
    s.validate().map_err(|e| format!("{ctx}: {e}"))?;
    Ok(s)
}

impl Update {
    pub fn is_empty(&self) -> bool {
        self.both.is_none() && self.a_to_b.is_none() && self.b_to_a.is_none()
    }

    /// New settings of both directions, or an error; the inputs are unchanged.
    pub fn apply(
        &self,
        ab: &LinkSettings,
        ba: &LinkSettings,
        ctx: &str,
    ) -> Result<(LinkSettings, LinkSettings), String> {
        let (mut nab, mut nba) = (ab.clone(), ba.clone());
        if let Some(b) = &self.both {
            nab = merge(&nab, b, &format!("{ctx}: both"))?;
            nba = merge(&nba, b, &format!("{ctx}: both"))?;
        }
        if let Some(p) = &self.a_to_b {
            nab = merge(&nab, p, &format!("{ctx}: a_to_b"))?;
        }
        if let Some(p) = &self.b_to_a {
            nba = merge(&nba, p, &format!("{ctx}: b_to_a"))?;
        }
        Ok((nab, nba))
    }
}

fn prob(name: &str, p: f64) -> Result<(), String> {
    if p.is_finite() && (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(format!("{name} must be a probability in [0, 1] (a fraction, not a percentage), got {p}"))
    }
}

fn nonneg(name: &str, x: f64) -> Result<(), String> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(format!("{name} must be a finite number >= 0, got {x}"))
    }
}

impl LinkSettings {
    pub fn validate(&self) -> Result<(), String> {
        nonneg("delay_ms", self.delay_ms)?;
        nonneg("jitter_ms", self.jitter_ms)?;
        if self.delay_ms > 3_600_000.0 {
            return Err("delay_ms must be at most one hour".into());
        }
        if self.jitter_ms > 3_600_000.0 {
            return Err("jitter_ms must be at most one hour".into());
        }
        prob("reorder", self.reorder)?;
        prob("reorder_correlation", self.reorder_correlation)?;
        prob("duplicate", self.duplicate)?;
        prob("corrupt", self.corrupt)?;
        if self.buffer_bytes == Some(0) {
            return Err("buffer_bytes must be > 0 (or null for no byte limit)".into());
        }
        if self.buffer_packets == Some(0) {
            return Err("buffer_packets must be > 0 (or null for no packet limit)".into());
        }
        match &self.loss {
            LossModel::None => {}
            LossModel::Bernoulli { p, correlation } => {
                prob("loss.p", *p)?;
                prob("loss.correlation", *correlation)?;
            }
            LossModel::GilbertElliott { p, r, one_minus_h, one_minus_k } => {
                prob("loss.p", *p)?;
                prob("loss.r", *r)?;
                prob("loss.one_minus_h", *one_minus_h)?;
                prob("loss.one_minus_k", *one_minus_k)?;
            }
        }
        match &self.qdisc {
            Qdisc::DropTail | Qdisc::DropHead => {}
            Qdisc::Codel { target_ms, interval_ms } => {
                if !(target_ms.is_finite() && *target_ms > 0.0) {
                    return Err(format!("qdisc.target_ms must be > 0, got {target_ms}"));
                }
                if !(interval_ms.is_finite() && *interval_ms > 0.0) {
                    return Err(format!("qdisc.interval_ms must be > 0, got {interval_ms}"));
                }
            }
            Qdisc::Red { min_bytes, max_bytes, p_max } => {
                if !(*min_bytes > 0 && min_bytes < max_bytes) {
                    return Err(format!("qdisc red needs 0 < min_bytes < max_bytes, got {min_bytes} and {max_bytes}"));
                }
                if !(p_max.is_finite() && *p_max > 0.0 && *p_max <= 1.0) {
                    return Err(format!("qdisc.p_max must be in (0, 1], got {p_max}"));
                }
            }
            Qdisc::Pie { target_ms } => {
                if !(target_ms.is_finite() && *target_ms > 0.0) {
                    return Err(format!("qdisc.target_ms must be > 0, got {target_ms}"));
                }
            }
            Qdisc::Fq { quantum } => {
                if !(64..=65536).contains(quantum) {
                    return Err(format!("qdisc.quantum must be 64 to 65536 bytes, got {quantum}"));
                }
            }
        }
        Ok(())
    }

    /// Numbers for the packet path. Loads the trace file, if any.
    pub fn compile(&self) -> Result<Params, String> {
        self.validate()?;
        let trace = match &self.trace_file {
            None => None,
            Some(path) => Some(Trace::load_cached(path)?),
        };
        let (limit_bytes, limit_packets) = match (self.buffer_bytes, self.buffer_packets) {
            (None, None) => (u64::MAX, 1000),
            (b, p) => (b.unwrap_or(u64::MAX), p.unwrap_or(u64::MAX)),
        };
        Ok(Params {
            rate_bps: self.rate_bps,
            overhead_bytes: self.overhead_bytes as u64,
            trace,
            limit_bytes,
            limit_packets,
            qdisc: self.qdisc.clone(),
            delay_ns: ms_to_ns(self.delay_ms),
            jitter_ns: self.jitter_ms * 1e6,
            jitter_dist: self.jitter_dist,
            reorder_on_jitter: self.reorder_on_jitter,
            loss: self.loss.clone(),
            reorder: self.reorder,
            reorder_correlation: self.reorder_correlation,
            duplicate: self.duplicate,
            corrupt: self.corrupt,
        })
    }
}

pub fn ms_to_ns(ms: f64) -> u64 {
    (ms * 1e6).round().max(0.0) as u64
}

/// Compiled settings of one direction.
#[derive(Clone, Debug)]
pub struct Params {
    pub rate_bps: u64,
    pub overhead_bytes: u64,
    pub trace: Option<std::sync::Arc<Trace>>,
    pub limit_bytes: u64,
    pub limit_packets: u64,
    pub qdisc: Qdisc,
    pub delay_ns: u64,
    pub jitter_ns: f64,
    pub jitter_dist: JitterDist,
    pub reorder_on_jitter: bool,
    pub loss: LossModel,
    pub reorder: f64,
    pub reorder_correlation: f64,
    pub duplicate: f64,
    pub corrupt: f64,
}

impl Default for Params {
    fn default() -> Self {
        LinkSettings::default().compile().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_example_parses_and_roundtrips() {
        let text = r#"{
          "seed": 7,
          "both": {"delay_ms": 10},
          "a_to_b": {"rate_bps": 50000000, "buffer_bytes": 150000,
                     "qdisc": {"kind": "codel", "target_ms": 5, "interval_ms": 100},
                     "jitter_ms": 1, "jitter_dist": "normal",
                     "loss": {"model": "gilbert_elliott", "p": 0.01, "r": 0.3}},
          "b_to_a": {"loss": {"model": "bernoulli", "p": 0.001}},
          "schedule": [{"at_ms": 1000, "a_to_b": {"rate_bps": 10000000}}]
        }"#;
        let c = Config::parse(text).unwrap();
        let (ab, ba) = c.initial().unwrap();
        assert_eq!(ab.rate_bps, 50_000_000);
        assert_eq!(ab.delay_ms, 10.0);
        assert_eq!(ba.delay_ms, 10.0);
        assert_eq!(ba.rate_bps, 0);
        assert_eq!(ab.loss, LossModel::GilbertElliott { p: 0.01, r: 0.3, one_minus_h: 1.0, one_minus_k: 0.0 });
        let s = c.sorted_schedule().unwrap();
        assert_eq!(s.len(), 1);
        // Round trip of a full settings object.
        let v = serde_json::to_string(&ab).unwrap();
        let back: LinkSettings = serde_json::from_str(&v).unwrap();
        assert_eq!(back, ab);
    }

    #[test]
    fn errors_name_the_key() {
        let c = Config::parse(r#"{"a_to_b": {"rate": 5}}"#).unwrap();
        let e = c.initial().unwrap_err();
        assert!(e.contains("unknown key 'rate'"), "{e}");
        let c = Config::parse(r#"{"a_to_b": {"loss": {"model": "bernoulli", "p": 5}}}"#).unwrap();
        let e = c.initial().unwrap_err();
        assert!(e.contains("loss.p"), "{e}");
        assert!(Config::parse(r#"{"bogus": 1}"#).is_err());
        let c = Config::parse(r#"{"schedule": [{"at_ms": 5, "a_to_b": {"delay_ms": -1}}]}"#).unwrap();
        assert!(c.sorted_schedule().unwrap_err().contains("schedule step 0"));
    }

    #[test]
    fn buffer_defaults() {
        let p = LinkSettings::default().compile().unwrap();
        assert_eq!((p.limit_bytes, p.limit_packets), (u64::MAX, 1000));
        let s = LinkSettings { buffer_bytes: Some(3000), ..Default::default() };
        let p = s.compile().unwrap();
        assert_eq!((p.limit_bytes, p.limit_packets), (3000, u64::MAX));
    }
}
