//! `ScriptedCheck`: a check that passes, fails, errors, hangs or panics on demand, after an
//! optional delay. For tests of whatever runs checks (this crate's runner, the burn-in
//! agent); playbooks can use it as `check: scripted`.

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
}

impl ScriptedCheck {
    pub const FIELDS: [&'static str; 3] = ["outcome", "delay_ms", "message"];

    pub fn new(name: &str, outcome: Outcome) -> ScriptedCheck {
        ScriptedCheck {
            name: name.to_string(),
            outcome,
            delay: Duration::ZERO,
            message: String::new(),
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
        Some(ScriptedCheck {
            name: name.to_string(),
            outcome,
            delay: Duration::from_millis(delay_ms),
            message,
        })
    }
}

impl Check for ScriptedCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, _ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            tokio::time::sleep(self.delay).await;
            let verdict = match self.outcome {
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
                .measured(json!({ "scripted": format!("{:?}", self.outcome) }))
        })
    }
}
