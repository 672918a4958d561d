//! A budget for refusal log lines: a client that retries a failing handshake or a wrong token
//! in a loop must not fill the disk with one line per attempt. At most
//! [`REFUSAL_LINES_PER_SECOND`] lines a second per budget; the next line allowed says how many
//! were left out meanwhile, so nothing is hidden, only counted.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusal lines one budget lets through per second.
pub const REFUSAL_LINES_PER_SECOND: u32 = 20;
const WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Window {
    started: Option<Instant>,
    used: u32,
    left_out: u64,
}

/// One budget (a `static` per kind of refusal).
#[derive(Debug)]
pub struct LogBudget {
    window: Mutex<Window>,
}

impl Default for LogBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl LogBudget {
    pub const fn new() -> LogBudget {
        LogBudget {
            window: Mutex::new(Window {
                started: None,
                used: 0,
                left_out: 0,
            }),
        }
    }

    /// `Some(left out since the last line)` when a line may be logged now; `None` (counted)
    /// when this second's budget is spent.
    pub fn allow(&self) -> Option<u64> {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if w.started.is_none_or(|s| now.duration_since(s) >= WINDOW) {
            w.started = Some(now);
            w.used = 0;
        }
        if w.used == REFUSAL_LINES_PER_SECOND {
            w.left_out += 1;
            return None;
        }
        assert!(w.used < REFUSAL_LINES_PER_SECOND);
        w.used += 1;
        Some(std::mem::take(&mut w.left_out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_budget_counts_what_it_leaves_out_and_says_so_next_second() {
        let b = LogBudget::new();
        for _ in 0..REFUSAL_LINES_PER_SECOND {
            assert_eq!(b.allow(), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(b.allow(), None);
        }
        std::thread::sleep(WINDOW + Duration::from_millis(20));
        assert_eq!(b.allow(), Some(5));
        assert_eq!(b.allow(), Some(0));
    }
}
