//! The two directions, their settings, the schedule and the control
//! requests, independent of sockets and clocks (time is a parameter).

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::config::{ms_to_ns, LinkSettings, Params, ScheduleStep, Update};
use crate::link::Link;

/// Both directions, their settings, the schedule.
pub struct Engine {
    pub settings: [LinkSettings; 2],
    pub links: [Link; 2],
    pub t0: u64,
    schedule: Vec<ScheduleStep>,
    next_step: usize,
    pub steps_applied: u64,
    pub updates_applied: u64,
}

impl Engine {
    pub fn new(
        settings: [LinkSettings; 2],
        params: [Params; 2],
        seed: u64,
        schedule: Vec<ScheduleStep>,
        t0: u64,
    ) -> Engine {
        let [pab, pba] = params;
        Engine {
            settings,
            links: [Link::new(pab, seed, 0, t0), Link::new(pba, seed, 1, t0)],
            t0,
            schedule,
            next_step: 0,
            steps_applied: 0,
            updates_applied: 0,
        }
    }

    fn step_time(&self, i: usize) -> u64 {
        self.t0 + ms_to_ns(self.schedule[i].at_ms)
    }

    /// The earliest time something is due without a frame arriving: a queued frame's release, the next
    /// schedule step; None when nothing is (the loop may then sleep until a frame comes).
    pub fn next_due(&self) -> Option<u64> {
        let step = (self.next_step < self.schedule.len()).then(|| self.step_time(self.next_step));
        self.links.iter().filter_map(|l| l.next_due()).chain(step).min()
    }

    /// Cheap check for the packet loop.
    #[inline]
    pub fn schedule_due(&self, now: u64) -> bool {
        self.next_step < self.schedule.len() && now >= self.step_time(self.next_step)
    }

    /// Apply every step whose time has come, at `now` (the loop calls this
    /// every iteration, i.e. within microseconds of the step's time).
    /// Returns the errors of steps that could not be applied.
    pub fn run_schedule(&mut self, now: u64) -> Vec<String> {
        let mut errs = vec![];
        while self.schedule_due(now) {
            let st = self.schedule[self.next_step].clone();
            let ctx = format!("schedule step at_ms {}", st.at_ms);
            match self.apply(&st.update(), now, &ctx) {
                Ok(()) => self.steps_applied += 1,
                Err(e) => errs.push(e),
            }
            self.next_step += 1;
        }
        errs
    }

    pub fn apply(&mut self, up: &Update, now: u64, ctx: &str) -> Result<(), String> {
        let (nab, nba) = up.apply(&self.settings[0], &self.settings[1], ctx)?;
        let pab = nab.compile().map_err(|e| format!("{ctx}: a_to_b: {e}"))?;
        let pba = nba.compile().map_err(|e| format!("{ctx}: b_to_a: {e}"))?;
        if nab != self.settings[0] {
            self.links[0].set_params(pab, now);
            self.settings[0] = nab;
        }
        if nba != self.settings[1] {
            self.links[1].set_params(pba, now);
            self.settings[1] = nba;
        }
        Ok(())
    }

    pub fn settings_json(&self) -> Value {
        json!({"a_to_b": self.settings[0], "b_to_a": self.settings[1]})
    }

    pub fn stats_json(&self) -> Value {
        json!({"a_to_b": self.links[0].snapshot(), "b_to_a": self.links[1].snapshot()})
    }

    pub fn t_ms(&self, now: u64) -> f64 {
        now.saturating_sub(self.t0) as f64 / 1e6
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CtlMsg {
    #[serde(default)]
    cmd: Option<String>,
    #[serde(default)]
    both: Option<Map<String, Value>>,
    #[serde(default)]
    a_to_b: Option<Map<String, Value>>,
    #[serde(default)]
    b_to_a: Option<Map<String, Value>>,
}

impl Engine {
    /// One control request (a JSON line) -> one JSON reply line.
    pub fn handle_ctl(&mut self, line: &str, now: u64) -> String {
        let eng = self;
        let msg: CtlMsg = match serde_json::from_str(line) {
        Ok(m) => m,
        Err(e) => {
            return json!({"ok": false, "error": format!("control: {e} (expected {{\"cmd\": \"set\"|\"get\"|\"stats\", \"both\"|\"a_to_b\"|\"b_to_a\": {{...}}}})")}).to_string()
        }
    };
        let up = Update { both: msg.both, a_to_b: msg.a_to_b, b_to_a: msg.b_to_a };
        let cmd = msg.cmd.unwrap_or_else(|| "set".to_string());
        match cmd.as_str() {
            "set" => match eng.apply(&up, now, "control") {
                Ok(()) => {
                    if !up.is_empty() {
                        eng.updates_applied += 1;
                    }
                    json!({"ok": true, "t_ms": eng.t_ms(now), "settings": eng.settings_json()}).to_string()
                }
                Err(e) => {
                    json!({"ok": false, "error": e, "t_ms": eng.t_ms(now), "settings": eng.settings_json()}).to_string()
                }
            },
            "get" | "stats" if !up.is_empty() => {
                json!({"ok": false, "error": format!("control: '{cmd}' takes no settings")}).to_string()
            }
            "get" => json!({"ok": true, "t_ms": eng.t_ms(now), "settings": eng.settings_json()}).to_string(),
            "stats" => {
                json!({"ok": true, "t_ms": eng.t_ms(now), "settings": eng.settings_json(), "stats": eng.stats_json()})
                    .to_string()
            }
            other => {
                json!({"ok": false, "error": format!("control: unknown cmd '{other}' (set, get, stats)")}).to_string()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::packet::Packet;

    const MS: u64 = 1_000_000;

    fn engine(cfg: &str, t0: u64) -> Engine {
        let c = Config::parse(cfg).unwrap();
        let (ab, ba) = c.initial().unwrap();
        let p = [ab.compile().unwrap(), ba.compile().unwrap()];
        Engine::new([ab, ba], p, c.seed, c.sorted_schedule().unwrap(), t0)
    }

    #[test]
    fn schedule_applies_at_its_virtual_time() {
        let t0 = 5_000 * MS;
        let mut e = engine(
            r#"{"a_to_b": {"rate_bps": 12000000, "buffer_packets": 100000},
                "schedule": [{"at_ms": 100, "a_to_b": {"rate_bps": 24000000}},
                             {"at_ms": 50, "b_to_a": {"delay_ms": 7}}]}"#,
            t0,
        );
        // Saturate a->b; poll every 10 µs like the packet loop (it polls faster).
        for i in 0..1000 {
            let mut d = vec![0u8; 1500];
            d[20] = (i % 256) as u8;
            e.links[0].ingress(Packet::new(d), t0);
        }
        let mut t = t0;
        let mut deps = vec![];
        let mut changed_ba_at = None;
        while t < t0 + 200 * MS {
            if e.schedule_due(t) {
                assert!(e.run_schedule(t).is_empty());
            }
            if changed_ba_at.is_none() && e.settings[1].delay_ms == 7.0 {
                changed_ba_at = Some(t);
            }
            e.links[0].advance(t);
            while let Some((r, _)) = e.links[0].pop_ready_at(t) {
                deps.push(r);
            }
            t += 10_000;
        }
        assert_eq!(changed_ba_at, Some(t0 + 50 * MS));
        assert_eq!(e.settings[0].rate_bps, 24_000_000);
        assert_eq!(e.steps_applied, 2);
        // Before 100 ms: 1 ms per packet; after: 0.5 ms per packet.
        let gaps: Vec<u64> = deps.windows(2).map(|w| w[1] - w[0]).collect();
        let before = deps.iter().filter(|&&d| d <= t0 + 100 * MS).count();
        assert_eq!(before, 100);
        assert!(gaps[..98].iter().all(|&g| g == MS));
        assert!(gaps[101..].iter().all(|&g| g == MS / 2), "{:?}", &gaps[95..110]);
    }

    #[test]
    fn control_set_get_stats_and_errors() {
        let mut e = engine(r#"{"both": {"delay_ms": 10}}"#, 0);
        let r: Value = serde_json::from_str(&e.handle_ctl(r#"{"a_to_b": {"rate_bps": 1000000}}"#, 5 * MS)).unwrap();
        assert_eq!(r["ok"], true);
        assert_eq!(r["t_ms"], 5.0);
        assert_eq!(r["settings"]["a_to_b"]["rate_bps"], 1_000_000);
        assert_eq!(r["settings"]["a_to_b"]["delay_ms"], 10.0);
        assert_eq!(r["settings"]["b_to_a"]["rate_bps"], 0);
        let r: Value = serde_json::from_str(&e.handle_ctl(r#"{"cmd": "get"}"#, 6 * MS)).unwrap();
        assert_eq!(r["settings"]["a_to_b"]["rate_bps"], 1_000_000);
        let r: Value = serde_json::from_str(&e.handle_ctl(r#"{"cmd": "stats"}"#, 6 * MS)).unwrap();
        assert_eq!(r["stats"]["a_to_b"]["rx_packets"], 0);
        // Errors leave the settings unchanged.
        let r: Value =
            serde_json::from_str(&e.handle_ctl(r#"{"both": {"loss": {"model": "bernoulli", "p": 2}}}"#, 7 * MS))
                .unwrap();
        assert_eq!(r["ok"], false);
        assert!(r["error"].as_str().unwrap().contains("loss.p"));
        assert_eq!(r["settings"]["a_to_b"]["loss"]["model"], "none");
        let r: Value = serde_json::from_str(&e.handle_ctl("not json", 7 * MS)).unwrap();
        assert_eq!(r["ok"], false);
        let r: Value = serde_json::from_str(&e.handle_ctl(r#"{"cmd": "reboot"}"#, 7 * MS)).unwrap();
        assert_eq!(r["ok"], false);
    }
}
