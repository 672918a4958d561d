//! Counters across the whole simulated fleet: SSH connections (open now, the most at once,
//! in all), commands and remote kills, Redfish requests and sessions. The benchmark reports
//! the peaks; tests check that agents close what they open.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct SimStats {
    ssh_open: AtomicU64,
    ssh_peak: AtomicU64,
    ssh_total: AtomicU64,
    commands: AtomicU64,
    kills: AtomicU64,
    redfish_requests: AtomicU64,
    redfish_sessions_open: AtomicU64,
    redfish_sessions_peak: AtomicU64,
    redfish_sessions_total: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct StatsSnapshot {
    pub ssh_connections_open: u64,
    pub ssh_connections_peak: u64,
    pub ssh_connections_total: u64,
    pub commands: u64,
    /// Hung commands killed by the agent (`kill -KILL -- -PGID`).
    pub remote_kills: u64,
    pub redfish_requests: u64,
    pub redfish_sessions_open: u64,
    pub redfish_sessions_peak: u64,
    pub redfish_sessions_total: u64,
}

impl SimStats {
    pub(crate) fn ssh_opened(&self) {
        let now = self.ssh_open.fetch_add(1, Ordering::SeqCst) + 1;
        self.ssh_peak.fetch_max(now, Ordering::SeqCst);
        self.ssh_total.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn ssh_closed(&self) {
        self.ssh_open.fetch_sub(1, Ordering::SeqCst);
    }
    pub(crate) fn command(&self) {
        self.commands.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn kill(&self) {
        self.kills.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn redfish_request(&self) {
        self.redfish_requests.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn redfish_session_opened(&self) {
        let now = self.redfish_sessions_open.fetch_add(1, Ordering::SeqCst) + 1;
        self.redfish_sessions_peak.fetch_max(now, Ordering::SeqCst);
        self.redfish_sessions_total.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn redfish_session_closed(&self) {
        self.redfish_sessions_open.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::SeqCst);
        StatsSnapshot {
            ssh_connections_open: g(&self.ssh_open),
            ssh_connections_peak: g(&self.ssh_peak),
            ssh_connections_total: g(&self.ssh_total),
            commands: g(&self.commands),
            remote_kills: g(&self.kills),
            redfish_requests: g(&self.redfish_requests),
            redfish_sessions_open: g(&self.redfish_sessions_open),
            redfish_sessions_peak: g(&self.redfish_sessions_peak),
            redfish_sessions_total: g(&self.redfish_sessions_total),
        }
    }
}
