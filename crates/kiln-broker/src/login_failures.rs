//! Failed SASL logins per client address, so guessing gets slower the more an address fails,
//! across all of its connections (the per-connection delay alone lets a client guess on
//! `max_connections` connections at once).
//!
//! The n-th failure of an address within `WINDOW` of its previous one is answered after
//! `base << min(n - 1, DOUBLINGS_MAX)`, at most `DELAY_MAX`. An address that fails no more for
//! `WINDOW` starts over. At most `ADDRESSES_MAX` addresses are tracked; past that the one
//! whose last failure is oldest is forgotten, so memory stays bounded whatever the attacker's
//! address space.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Addresses tracked at once.
pub const ADDRESSES_MAX: usize = 4096;
/// How long an address's failures are remembered after its last one.
pub const WINDOW: Duration = Duration::from_secs(300);
/// The delay doubles at most this many times (base 1 s: 1, 2, 4, 8, 16, 30 s).
const DOUBLINGS_MAX: u32 = 5;
/// No failed login waits longer than this.
pub const DELAY_MAX: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

pub struct LoginFailures {
    base: Duration,
    by_address: Mutex<HashMap<IpAddr, Failures>>,
}

impl LoginFailures {
    pub fn new(base: Duration) -> LoginFailures {
        LoginFailures {
            base,
            by_address: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `address` at `now`; how long to wait before answering it.
    pub fn failed(&self, address: IpAddr, now: Instant) -> Duration {
        let mut map = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        let count = match map.get(&address) {
            Some(f) if now.saturating_duration_since(f.last) < WINDOW => f.count.saturating_add(1),
            _ => 1,
        };
        if !map.contains_key(&address) && map.len() >= ADDRESSES_MAX {
            let oldest = map.iter().min_by_key(|(_, f)| f.last).map(|(a, _)| *a);
            if let Some(oldest) = oldest {
                map.remove(&oldest);
            }
        }
        map.insert(address, Failures { count, last: now });
        debug_assert!(map.len() <= ADDRESSES_MAX);
        let doublings = (count - 1).min(DOUBLINGS_MAX);
        self.base
            .checked_mul(1u32 << doublings)
            .unwrap_or(DELAY_MAX)
            .min(DELAY_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_waits_longer_with_each_failure_and_starts_over_after_the_window() {
        let f = LoginFailures::new(Duration::from_secs(1));
        let a: IpAddr = "10.0.0.1".parse().expect("an address");
        let b: IpAddr = "10.0.0.2".parse().expect("an address");
        let t = Instant::now();
        let waits: Vec<u64> = (0..8)
            .map(|i| f.failed(a, t + Duration::from_secs(i)).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        // Another address is not slowed by the first one's failures.
        assert_eq!(
            f.failed(b, t + Duration::from_secs(8)),
            Duration::from_secs(1)
        );
        // Quiet for a window: back to the base delay.
        assert_eq!(
            f.failed(a, t + WINDOW + Duration::from_secs(8)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn the_table_holds_at_most_its_limit_forgetting_the_stalest_address() {
        let f = LoginFailures::new(Duration::from_millis(10));
        let t = Instant::now();
        let first: IpAddr = "192.168.0.1".parse().expect("an address");
        f.failed(first, t);
        f.failed(first, t);
        for i in 0..ADDRESSES_MAX as u32 {
            let addr = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            f.failed(addr, t + Duration::from_millis(1));
        }
        assert_eq!(
            f.by_address.lock().expect("not poisoned").len(),
            ADDRESSES_MAX
        );
        // The first address, the stalest, was forgotten: it starts at the base delay again.
        assert_eq!(
            f.failed(first, t + Duration::from_millis(2)),
            Duration::from_millis(10)
        );
    }
}
