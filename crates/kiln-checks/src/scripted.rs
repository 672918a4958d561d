//! `ScriptedCheck`: a check that passes, fails, errors, hangs or panics on demand, after an
//! optional delay. For tests of whatever runs checks (this crate's runner, the burn-in
//! agent); playbooks can use it as `check: scripted`. `hosts` limits the outcome to some
//! nodes (the others pass) and `percent` makes it intermittent (the rest of the time the
//! check passes), so one playbook can script a whole fleet for an end-to-end test.

use std::time::Duration;

use serde_json::json;

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult, Verdict};
use crate::yaml::{Fields, LoadError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail,
    Error,
    /// Never finishes: only the deadline ends it.
    Hang,
    /// Panics (the runner must turn this into `Error`).
    Panic,
}

impl Outcome {
    pub const NAMES: [&'static str; 5] = ["pass", "fail", "error", "hang", "panic"];

    pub fn from_name(name: &str) -> Option<Outcome> {
        Some(match name {
            "pass" => Outcome::Pass,
            "fail" => Outcome::Fail,
            "error" => Outcome::Error,
            "hang" => Outcome::Hang,
            "panic" => Outcome::Panic,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedCheck {
    pub name: String,
    pub outcome: Outcome,
    pub delay: Duration,
    pub message: String,
    /// The outcome applies only to these hostnames (others pass); empty: to every node.
    pub hosts: Vec<String>,
    /// Chance, in percent, that the outcome applies on one run (else the check passes).
    pub percent: u8,
}

impl ScriptedCheck {
    pub const FIELDS: [&'static str; 5] = ["outcome", "delay_ms", "message", "hosts", "percent"];

    pub fn new(name: &str, outcome: Outcome) -> ScriptedCheck {
        ScriptedCheck {
            name: name.to_string(),
            outcome,
            delay: Duration::ZERO,
            message: String::new(),
            hosts: Vec::new(),
            percent: 100,
        }
    }

    pub fn with_delay(mut self, delay: Duration) -> ScriptedCheck {
        self.delay = delay;
        self
    }

    pub(crate) fn parse(
        name: &str,
        f: &mut Fields<'_>,
        errors: &mut Vec<LoadError>,
    ) -> Option<ScriptedCheck> {
        let outcome = match f.opt_choice("outcome", &Outcome::NAMES, errors) {
            Some(o) => Outcome::from_name(&o)?,
            None => {
                if f.take("outcome").is_none() {
                    f.missing("outcome", errors);
                }
                return None;
            }
        };
        let delay_ms = f.opt_u64("delay_ms", 0..=86_400_000, errors).unwrap_or(0);
        let message = f.opt_str("message", errors).unwrap_or_default();
        let hosts = f.opt_str_list("hosts", None, errors).unwrap_or_default();
        let percent = f.opt_u64("percent", 0..=100, errors).unwrap_or(100);
        Some(ScriptedCheck {
            name: name.to_string(),
            outcome,
            delay: Duration::from_millis(delay_ms),
            message,
            hosts,
            percent: u8::try_from(percent).unwrap_or(100),
        })
    }
}

impl ScriptedCheck {
    /// Whether the scripted outcome applies to `hostname` on this run.
    pub fn applies_to(&self, hostname: &str) -> bool {
        if !self.hosts.is_empty() && !self.hosts.iter().any(|h| h == hostname) {
            return false;
        }
        if self.percent >= 100 {
            return true;
        }
        // A fresh randomly keyed hasher per call: a coin without a dependency.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write(hostname.as_bytes());
        h.finish() % 100 < u64::from(self.percent)
    }
}

impl Check for ScriptedCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            tokio::time::sleep(self.delay).await;
            let outcome = if self.applies_to(&ctx.node.hostname) {
                self.outcome
            } else {
                Outcome::Pass
            };
            let verdict = match outcome {
                Outcome::Pass => Verdict::Pass,
                Outcome::Fail => Verdict::Fail,
                Outcome::Error => Verdict::Error,
                Outcome::Hang => {
                    std::future::pending::<()>().await;
                    unreachable!("pending never completes")
                }
                Outcome::Panic => panic!("scripted panic in {}", self.name),
            };
            let message = if self.message.is_empty() {
                format!("scripted {verdict:?}")
            } else {
                self.message.clone()
            };
            CheckResult::new(&self.name, verdict, message)
                .measured(json!({ "scripted": format!("{outcome:?}") }))
        })
    }
}
