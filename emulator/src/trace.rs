//! Mahimahi packet-delivery traces: one line per delivery opportunity, the
//! line holding the millisecond timestamp at which one 1500-byte packet can be
//! delivered. Timestamps are non-decreasing; repeated timestamps are several
//! opportunities in the same millisecond. The trace loops with a period equal
//! to its last timestamp (Mahimahi's semantics).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Bytes one delivery opportunity can carry.
pub const OPPORTUNITY_BYTES: u64 = 1500;

#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// Opportunity times in ms, non-decreasing.
    pub times_ms: Vec<u64>,
    /// Loop period in ms (= last timestamp, > 0).
    pub period_ms: u64,
}

impl Trace {
    pub fn parse(text: &str, name: &str) -> Result<Trace, String> {
        let mut times = Vec::new();
        let mut last = 0u64;
        for (i, line) in text.lines().enumerate() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let t: u64 = l.parse().map_err(|_| {
                format!("trace {name}: line {}: expected a millisecond timestamp (integer), got '{l}'", i + 1)
            })?;
            if t < last {
                return Err(format!("trace {name}: line {}: timestamp {t} is smaller than the previous {last}", i + 1));
            }
            last = t;
            times.push(t);
        }
        if times.is_empty() {
            return Err(format!("trace {name}: no timestamps"));
        }
        if last == 0 {
            return Err(format!("trace {name}: the last timestamp (the loop period) must be > 0"));
        }
        Ok(Trace { times_ms: times, period_ms: last })
    }

    pub fn load(path: &str) -> Result<Trace, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("trace_file '{path}': {e}"))?;
        Trace::parse(&text, path)
    }

    /// Load through a cache keyed by path, size and modification time, so a
    /// schedule step switching back to a trace does no file I/O on the
    /// packet path while a rewritten file is still picked up.
    pub fn load_cached(path: &str) -> Result<Arc<Trace>, String> {
        type Entry = (u64, SystemTime, Arc<Trace>);
        static CACHE: Mutex<Option<HashMap<String, Entry>>> = Mutex::new(None);
        let md = std::fs::metadata(path).map_err(|e| format!("trace_file '{path}': {e}"))?;
        let key = (md.len(), md.modified().unwrap_or(SystemTime::UNIX_EPOCH));
        let mut g = CACHE.lock().unwrap();
        let map = g.get_or_insert_with(HashMap::new);
        if let Some((len, mtime, t)) = map.get(path) {
            if (*len, *mtime) == key {
                return Ok(t.clone());
            }
        }
        let t = Arc::new(Trace::load(path)?);
        map.insert(path.to_string(), (key.0, key.1, t.clone()));
        Ok(t)
    }

    /// Average rate of the trace in bits/s.
    pub fn mean_rate_bps(&self) -> f64 {
        self.times_ms.len() as f64 * OPPORTUNITY_BYTES as f64 * 8.0 / (self.period_ms as f64 / 1000.0)
    }
}

/// Walks the opportunities of a looping trace from a start time.
#[derive(Clone, Debug)]
pub struct TraceCursor {
    pub start_ns: u64,
    pub idx: usize,
    pub cycle: u64,
}

impl TraceCursor {
    pub fn new(start_ns: u64) -> Self {
        TraceCursor { start_ns, idx: 0, cycle: 0 }
    }

    /// Time of the current opportunity.
    pub fn time_ns(&self, tr: &Trace) -> u64 {
        self.start_ns + (self.cycle * tr.period_ms + tr.times_ms[self.idx]) * 1_000_000
    }

    pub fn advance(&mut self, tr: &Trace) {
        self.idx += 1;
        if self.idx == tr.times_ms.len() {
            self.idx = 0;
            self.cycle += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_loop() {
        let t = Trace::parse("1\n1\n\n3\n# c\n4\n", "t").unwrap();
        assert_eq!(t.times_ms, vec![1, 1, 3, 4]);
        assert_eq!(t.period_ms, 4);
        assert!((t.mean_rate_bps() - 4.0 * 12000.0 / 0.004).abs() < 1e-6);
        let mut c = TraceCursor::new(1_000);
        let mut seen = vec![];
        for _ in 0..6 {
            seen.push(c.time_ns(&t));
            c.advance(&t);
        }
        assert_eq!(seen, vec![1_001_000, 1_001_000, 3_001_000, 4_001_000, 5_001_000, 5_001_000]);
    }

    #[test]
    fn parse_errors() {
        assert!(Trace::parse("", "t").unwrap_err().contains("no timestamps"));
        assert!(Trace::parse("5\n3\n", "t").unwrap_err().contains("line 2"));
        assert!(Trace::parse("x\n", "t").unwrap_err().contains("line 1"));
        assert!(Trace::parse("0\n0\n", "t").unwrap_err().contains("period"));
    }
}
