//! The openraft type configuration of a replicated partition, and its async runtime.

use std::cell::RefCell;
use std::future::Future;
use std::io::Cursor;
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use rand08::RngCore;

use crate::payload::Payload;
use crate::rng::StableRng;

/// A Raft node id: the broker's node id.
pub type NodeId = u64;

/// What applying an entry yields: the Kafka offsets it took and the leader epoch it was
/// written in. Blank, membership and command entries take no offsets (`record_count == 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub base_offset: i64,
    pub record_count: u32,
    /// The Raft term of the entry, which is the Kafka leader epoch.
    pub leader_epoch: u64,
}

openraft::declare_raft_types!(
    /// The type configuration of a replicated partition.
    pub KilnRaft:
        D = Payload,
        R = Applied,
        NodeId = NodeId,
        Node = openraft::EmptyNode,
        Entry = openraft::Entry<KilnRaft>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = KilnRuntime,
);

pub type Entry = openraft::Entry<KilnRaft>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Raft = openraft::Raft<KilnRaft>;
pub type StorageError = openraft::StorageError<NodeId>;

thread_local! {
    static RNG: RefCell<StableRng> = RefCell::new(StableRng::seed(entropy()));
}

/// A seed from the clock and the thread, for production: election timeouts need only differ
/// between brokers, not be secret.
fn entropy() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let thread = format!("{:?}", std::thread::current().id());
    thread
        .bytes()
        .fold(now ^ u64::from(std::process::id()), |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Makes every random choice openraft makes on this thread (its election timeouts) follow
/// `seed`. The simulation calls it so a seed replays exactly; in production the generator is
/// seeded from the clock.
pub fn seed_thread_rng(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = StableRng::seed(seed));
}

/// Handle to the per-thread generator [`seed_thread_rng`] seeds.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadRng;

impl RngCore for ThreadRng {
    fn next_u32(&mut self) -> u32 {
        RNG.with(|r| r.borrow_mut().next_u32())
    }
    fn next_u64(&mut self) -> u64 {
        RNG.with(|r| r.borrow_mut().next_u64())
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        RNG.with(|r| r.borrow_mut().fill_bytes(dest))
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand08::Error> {
        RNG.with(|r| r.borrow_mut().try_fill_bytes(dest))
    }
}

/// openraft's tokio runtime with one change: its random numbers come from [`ThreadRng`], so a
/// simulation can seed them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KilnRuntime;

impl AsyncRuntime for KilnRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = ThreadRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ThreadRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}
