//! Group commit: one flusher thread per partition, and the durable offset it publishes.
//!
//! Appends write without fsync and poke the flusher. The flusher fsyncs everything written so
//! far in one go and publishes the new durable offset, which wakes every waiter it covers;
//! appends that arrive during an fsync are covered by the next one. So under load one fsync
//! serves many batches, and an idle log pays one fsync per batch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::watch;

use crate::partition::lock;
use crate::{FlushPolicy, LogError};

#[derive(Default)]
struct SignalState {
    dirty: bool,
    shutdown: bool,
}

/// Wakes the flusher thread.
#[derive(Default)]
pub(crate) struct FlushSignal {
    state: Mutex<SignalState>,
    cond: Condvar,
}

impl FlushSignal {
    /// Something was written that is not yet fsynced.
    pub fn notify(&self) {
        lock(&self.state).dirty = true;
        self.cond.notify_one();
    }

    pub fn shutdown(&self) {
        lock(&self.state).shutdown = true;
        self.cond.notify_one();
    }

    /// Blocks until a flush is due. Returns false on shutdown.
    fn wait(&self, policy: FlushPolicy) -> bool {
        let mut state = lock(&self.state);
        match policy {
            FlushPolicy::EveryBatch => {
                while !state.dirty && !state.shutdown {
                    state = self.cond.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            }
            FlushPolicy::Interval(every) => {
                let deadline = Instant::now() + every;
                loop {
                    let now = Instant::now();
                    if state.shutdown || now >= deadline {
                        break;
                    }
                    state = match self.cond.wait_timeout(state, deadline - now) {
                        Ok((s, _)) => s,
                        Err(e) => e.into_inner().0,
                    };
                }
            }
        }
        if state.shutdown {
            return false;
        }
        state.dirty = false;
        true
    }
}

/// Runs `step` on a dedicated thread each time a flush is due, until shutdown or until `step`
/// returns false (the log is gone or poisoned).
pub(crate) fn spawn_flusher(
    name: String,
    signal: Arc<FlushSignal>,
    policy: FlushPolicy,
    mut step: impl FnMut() -> bool + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        while signal.wait(policy) {
            if !step() {
                break;
            }
        }
    })
}

/// The durable offset (every offset below it is fsynced) and the poison flag.
pub(crate) struct Durability {
    tx: watch::Sender<i64>,
    poisoned: Mutex<Option<String>>,
    is_poisoned: AtomicBool,
    closed: AtomicBool,
}

impl Durability {
    pub fn new(durable: i64) -> Durability {
        Durability {
            tx: watch::Sender::new(durable),
            poisoned: Mutex::new(None),
            is_poisoned: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    pub fn durable(&self) -> i64 {
        *self.tx.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.tx.subscribe()
    }

    /// Everything below `offset` is fsynced. The durable offset never moves backwards.
    pub fn publish(&self, offset: i64) {
        self.tx.send_if_modified(|durable| {
            if offset > *durable {
                *durable = offset;
                true
            } else {
                false
            }
        });
    }

    /// An fsync failed: from now on nothing more can be promised durable. Wakes every waiter.
    pub fn poison(&self, reason: String) {
        tracing::error!(%reason, "fsync failed; poisoning the log");
        lock(&self.poisoned).get_or_insert(reason);
        self.is_poisoned.store(true, Ordering::Release);
        self.tx.send_modify(|_| {});
    }

    pub fn check(&self) -> Result<(), LogError> {
        if !self.is_poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(LogError::Poisoned(
            lock(&self.poisoned).clone().unwrap_or_default(),
        ))
    }

    /// No more flushes will happen. Wakes every waiter.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.tx.send_modify(|_| {});
    }

    /// Resolves once every offset below `next_offset` is durable. Fails if the log is poisoned
    /// or closed before that.
    pub async fn wait(&self, next_offset: i64) -> Result<(), LogError> {
        let mut rx = self.tx.subscribe();
        loop {
            // Covered by an fsync that succeeded: durable even if a later one failed.
            if *rx.borrow_and_update() >= next_offset {
                return Ok(());
            }
            self.check()?;
            if self.closed.load(Ordering::Acquire) {
                return Err(LogError::Closed);
            }
            if rx.changed().await.is_err() {
                return Err(LogError::Closed);
            }
        }
    }
}
