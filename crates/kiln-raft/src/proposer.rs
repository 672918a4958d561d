//! [`Proposer`]: the ordered, coalescing front door of a replicated partition's leader.
//!
//! Producers pipeline requests, and a partition's order is the order in which its appends
//! reach Raft. `ReplicatedPartition::append` proposes when its future is first polled, so two
//! appends awaited on different tasks may reach Raft in either order. The proposer fixes the
//! order at [`Proposer::submit`] (a synchronous call, made while the broker dispatches requests
//! in arrival order) and proposes from one task, in that order.
//!
//! It also coalesces: appends that queue up while earlier entries are being replicated are
//! joined into one Raft entry (up to `max_entry_bytes`), so one round of AppendEntries and one
//! fsync per replica covers many producer requests. Each append still gets its own offsets:
//! the entry's base offset plus the records of the appends before it in the entry.
//!
//! An append of records need not wait for the proposing task to be scheduled: while this
//! replica leads the term the proposer knows, a slot is free and nothing is queued unwritten
//! before it, the task that submits it checks it and writes it into the log at once
//! (`write_now`, an entry of its own, `LogStore::write_ahead`), and the proposing task only
//! hands it to Raft, in submit order. Otherwise it queues and joins its neighbours as above.
//!
//! And it is where idempotent producers are checked (`producers.rs`): it keeps the producer
//! table as of its log end and the next Kafka offset, so a retried batch is recognised (and
//! answered with its first write's offsets once that is committed) even while the first write
//! is still in flight. Both are rebuilt from the state machine whenever they may be wrong: at
//! the start of each term (once nothing of its own is in flight and everything before the term
//! is applied) and after any write whose fate is unknown. The offsets it expects are checked
//! against the ones the commit gives (a pair assertion); a disagreement is logged and forces a
//! rebuild.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kiln_log::ProducerBatch;
use openraft::error::ClientWriteError;
use openraft::ServerState;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::liveness::Liveness;
use crate::log_store::{lock, LogStore};
use crate::partition::{AppendAck, PartitionError};
use crate::payload::{Command, Payload};
use crate::producers::{sequence_ahead, ProducerTable, Verdict};
use crate::state_machine::StateMachine;
use crate::types::Raft;

/// Entries proposed and not yet committed, per partition: enough to keep the leader writing
/// while earlier entries are fsynced and replicated, few enough that requests queue up here
/// and join into large entries. (Measured: 2, 4, 8 and 16 give the same standalone throughput.)
const ENTRIES_IN_FLIGHT: usize = 4;
/// Longest wait, when a term starts, for everything before it to be applied.
const TERM_START_WAIT: Duration = Duration::from_secs(5);
/// How often a write waiting for its commit, and a term start waiting for the log to be
/// applied, look at the Raft metrics.
const LEADERSHIP_POLL: Duration = Duration::from_millis(20);
/// Longest wait for a retried batch's first write to be committed.
const DUPLICATE_WAIT: Duration = Duration::from_secs(30);
/// How long a producer's batches that leave a gap are answered retriably
/// ([`PartitionError::EarlierBatchUnwritten`]) before the gap counts as real
/// (OUT_OF_ORDER_SEQUENCE_NUMBER): Kafka clients' default request timeout, the longest an
/// earlier batch may take to be retried.
const GAP_RETRY_WINDOW: Duration = Duration::from_secs(30);
/// Producers whose gap is being waited out ([`Gaps`]); past it all are forgotten (their next
/// gap starts a new window).
const GAPS_MAX: usize = 10_000;

/// What a submitted append resolves to.
pub type AppendReceiver = oneshot::Receiver<Result<AppendAck, PartitionError>>;

struct Proposal {
    /// Records to join with their neighbours, or a command that goes alone.
    what: What,
    reply: oneshot::Sender<Result<AppendAck, PartitionError>>,
    /// The Kafka offset its first record will take, as the proposer counts (pair-checked).
    expected_base: Option<i64>,
    /// Dropped unwritten if nobody waits for it any more ([`Proposer::submit_produce`]).
    abandonable: bool,
    /// Its place among the proposals queued unwritten (see [`Lane`]); 0 for one written at
    /// its submit.
    seq: u64,
    /// Written at its submit (see [`Proposer::write_now`]): proposed alone, as it is.
    written: Option<Written>,
}

/// A proposal prepared and written ahead at its submit, by the task that received it.
struct Written {
    payload: Payload,
    term: u64,
    slot: tokio::sync::OwnedSemaphorePermit,
}

enum What {
    Records { batches: Bytes, records: u32 },
    Command(Command),
}

impl Proposal {
    fn len(&self) -> usize {
        match &self.what {
            What::Records { batches, .. } => batches.len(),
            What::Command(_) => 0,
        }
    }

    fn records(&self) -> u32 {
        match &self.what {
            What::Records { records, .. } => *records,
            What::Command(_) => 0,
        }
    }
}

/// Cheap to clone; the proposing task ends when every clone is dropped.
#[derive(Clone)]
pub struct Proposer {
    /// A channel without a count bound because `submit` must not wait (it runs while requests
    /// are dispatched in order); bounded in bytes instead (`queued`): past `max_queued` an
    /// append is refused at once. Commands carry no records and are never refused.
    queue: mpsc::UnboundedSender<Proposal>,
    /// The proposing task's slots, for [`Proposer::entries_in_flight`].
    slots: Arc<Semaphore>,
    /// Record bytes submitted and not yet taken by the proposing task, at most `max_queued`.
    queued: Arc<AtomicUsize>,
    max_queued: usize,
    /// What a submit needs to write at once ([`Proposer::write_now`]).
    now: Arc<WriteNow>,
}

/// The handles the proposing task and the submitters share (one set, held by both).
struct WriteNow {
    lane: Arc<Mutex<Lane>>,
    raft: Raft,
    /// The replica's log, into which a leader writes its entries ahead of Raft.
    store: LogStore,
    state: StateMachine,
    /// Set when a write's fate is unknown or its offsets disagreed: rebuild before the next.
    stale: Arc<AtomicBool>,
    /// The replica's liveness: a write waits for its commit no longer than the leader's lease
    /// holds (`liveness.rs`).
    liveness: Arc<Liveness>,
}

/// What the proposing task and the tasks that submit share: an append of records is prepared
/// and written by the task that submits it ([`Proposer::write_now`]) when the proposer knows its
/// term and nothing is queued unwritten before it, so entries reach the log in submit order
/// either way.
#[derive(Default)]
struct Lane {
    leading: Option<Leading>,
    /// Producers whose last batch left a gap, and since when.
    gaps: Gaps,
    /// Proposals queued unwritten so far, and how many of them the proposing task is done with
    /// (written or answered).
    enqueued: u64,
    done: u64,
}

impl Proposer {
    /// Starts the proposing task for the Raft node `raft` (on the current tokio runtime). The
    /// task holds only the Raft handle, so a partition can own its proposer.
    /// `state`: the partition's state machine (its producer table and high watermark).
    /// `max_queued_bytes`: see [`crate::partition::PROPOSER_QUEUE_BYTES_MAX`].
    pub fn start(
        raft: Raft,
        store: LogStore,
        state: StateMachine,
        max_entry_bytes: usize,
        max_queued_bytes: usize,
        liveness: Arc<Liveness>,
    ) -> Proposer {
        let (queue, rx) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(ENTRIES_IN_FLIGHT));
        let queued = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(WriteNow {
            lane: Arc::new(Mutex::new(Lane::default())),
            raft,
            store,
            state,
            stale: Arc::new(AtomicBool::new(false)),
            liveness,
        });
        let run = Run {
            queued: Arc::clone(&queued),
            shared: Arc::clone(&shared),
            rx,
            max_entry_bytes: max_entry_bytes.max(1),
            slots: Arc::clone(&slots),
            last_taken: 0,
        };
        tokio::spawn(run.run());
        Proposer {
            queue,
            slots,
            queued,
            max_queued: max_queued_bytes,
            now: shared,
        }
    }

    /// Entries proposed and not yet committed or refused (at most `ENTRIES_IN_FLIGHT`; the
    /// proposing task also holds them all while a term starts).
    pub fn entries_in_flight(&self) -> usize {
        ENTRIES_IN_FLIGHT.saturating_sub(self.slots.available_permits())
    }

    /// Queues `batches` (validated here: lengths, magic, CRC32C) behind every earlier submit.
    /// The receiver resolves once the append is committed (fsynced on a majority) or refused.
    /// Never refused for a full queue and never dropped: for writers whose in-memory state
    /// counts on every submit reaching the log (the offsets and metadata groups).
    pub fn submit(&self, batches: Bytes) -> AppendReceiver {
        self.submit_records(batches, false, false)
    }

    /// As [`Proposer::submit`], for a producer's request: refused at once with
    /// [`PartitionError::QueueFull`] past the queue bound. With `answered` (acks 1 or all), it
    /// is also dropped unwritten if its receiver is gone before it is proposed (the produce
    /// timed out; the client retries). An acks=0 produce is never answered, so its receiver is
    /// dropped at once: it must be written all the same.
    pub fn submit_produce(&self, batches: Bytes, answered: bool) -> AppendReceiver {
        self.submit_records(batches, true, answered)
    }

    fn submit_records(&self, batches: Bytes, bounded: bool, abandonable: bool) -> AppendReceiver {
        let (reply, rx) = oneshot::channel();
        let records = kiln_log::batch::validate_batches(&batches)
            .map_err(PartitionError::from)
            .and_then(|_| kiln_log::batch::count_records(&batches).map_err(PartitionError::from));
        match records {
            Err(e) => {
                let _ = reply.send(Err(e));
            }
            Ok(records) => {
                let p = Proposal {
                    what: What::Records { batches, records },
                    reply,
                    expected_base: None,
                    abandonable,
                    seq: 0,
                    written: None,
                };
                let p = self.write_now(p);
                if let Some(p) = p {
                    if self.reserve(p.len(), bounded) {
                        self.enqueue(p);
                    } else {
                        let _ = p.reply.send(Err(PartitionError::QueueFull {
                            queued: self.queued_bytes(),
                            max: self.max_queued,
                        }));
                    }
                }
            }
        }
        rx
    }

    /// Prepares an append of records and writes it into the log at once, on the task that
    /// submits it, when that keeps the submit order: this replica leads the term the proposer
    /// knows (its producer table and offsets up to date), a slot is free and nothing is queued
    /// unwritten. The proposing task then only hands it to Raft. Returns the proposal when it
    /// must queue.
    fn write_now(&self, p: Proposal) -> Option<Proposal> {
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            return Some(p);
        };
        let mut lane = lock(&self.now.lane);
        let Some(term) = lane.leading.as_ref().map(|l| l.term) else {
            return Some(p);
        };
        if lane.enqueued != lane.done || self.now.stale.load(Ordering::Acquire) {
            return Some(p);
        }
        let id = {
            let m = self.now.raft.metrics();
            let m = m.borrow();
            if m.state != ServerState::Leader
                || m.current_term != term
                || !lease_holds(&self.now.liveness, term)
                || self.now.liveness.handing_over(term)
            {
                return Some(p);
            }
            m.id
        };
        let p = match prepare(&mut lane, p, &self.now.state, &self.now.raft) {
            Prepared::Write(p) => p,
            Prepared::Answered => return None,
        };
        let What::Records { batches, records } = &p.what else {
            unreachable!("only records are written at their submit");
        };
        // Cloned: see `Run::write` (the log copies a request's slice of its frame).
        let payload =
            self.now
                .store
                .write_ahead(term, id, Payload::records(batches.clone(), *records));
        // Sent under the lane's lock: the proposing task hands entries to Raft in the order
        // they were written.
        self.enqueue(Proposal {
            written: Some(Written {
                payload,
                term,
                slot,
            }),
            ..p
        });
        drop(lane);
        None
    }

    /// Queues a command behind every earlier submit (it is never joined with records).
    pub fn submit_command(&self, command: Command) -> AppendReceiver {
        let (reply, rx) = oneshot::channel();
        self.enqueue(Proposal {
            what: What::Command(command),
            reply,
            expected_base: None,
            abandonable: false,
            seq: 0,
            written: None,
        });
        rx
    }

    /// Record bytes queued now.
    pub fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Counts `len` more queued bytes, unless `bounded` and that would pass the bound (the
    /// internal writers' bytes count too, but they are never refused).
    fn reserve(&self, len: usize, bounded: bool) -> bool {
        let max = if bounded { self.max_queued } else { usize::MAX };
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                q.checked_add(len).filter(|&n| n <= max)
            })
            .is_ok()
    }

    fn enqueue(&self, mut proposal: Proposal) {
        if proposal.written.is_none() {
            let mut lane = lock(&self.now.lane);
            lane.enqueued += 1;
            proposal.seq = lane.enqueued;
            // Sent under the lock, so a write at submit never passes it in the channel.
            let sent = self.queue.send(proposal);
            drop(lane);
            return self.unsent(sent);
        }
        let sent = self.queue.send(proposal);
        self.unsent(sent);
    }

    /// Answers a proposal the proposing task will never take (it stopped).
    fn unsent(&self, sent: Result<(), mpsc::error::SendError<Proposal>>) {
        if let Err(mpsc::error::SendError(p)) = sent {
            if p.written.is_none() {
                release(&self.queued, p.len());
            }
            let _ = p.reply.send(Err(PartitionError::Stopped(
                "the partition's proposer has stopped".into(),
            )));
        }
    }
}

/// What the proposer knows while it leads a term (see the module docs).
struct Leading {
    term: u64,
    /// The producer table as of the log end (everything proposed in this term included).
    table: ProducerTable,
    /// The Kafka offset the next record proposed will take.
    next_offset: i64,
}

/// Takes `len` bytes off the queued count (taken by the proposing task, or never sent).
fn release(queued: &AtomicUsize, len: usize) {
    let before = queued.fetch_sub(len, Ordering::AcqRel);
    assert!(
        before >= len,
        "queued bytes {before} below a proposal's {len}"
    );
}

struct Run {
    queued: Arc<AtomicUsize>,
    /// What it shares with the submitters (the same handles `write_now` uses).
    shared: Arc<WriteNow>,
    rx: mpsc::UnboundedReceiver<Proposal>,
    max_entry_bytes: usize,
    slots: Arc<Semaphore>,
    /// The `seq` of the last proposal taken off the queue unwritten.
    last_taken: u64,
}

/// A batch ahead of its producer's next sequence was almost always sent behind one that
/// failed or is still being retried: the proposer dropped it (its produce timed out while
/// queued), refused it (not the leader yet, queue full), or it went to the old leader. For
/// [`GAP_RETRY_WINDOW`] from the first such batch such gaps are answered
/// [`PartitionError::EarlierBatchUnwritten`] (retriable, nothing written), so the client
/// resends both in order instead of starting a new epoch (see that error); past it, or for a
/// gap at another sequence, as out of sequence.
#[derive(Default)]
struct Gaps {
    /// Producer id -> (the sequence expected, when a batch first left a gap there).
    seen: std::collections::HashMap<i64, (i32, tokio::time::Instant)>,
}

impl Gaps {
    /// Whether a batch of `producer_id` leaving a gap after `expected` is answered retriably.
    fn retriable(&mut self, producer_id: i64, expected: i32, now: tokio::time::Instant) -> bool {
        if self.seen.len() >= GAPS_MAX && !self.seen.contains_key(&producer_id) {
            self.seen.clear();
        }
        let (at, since) = *self
            .seen
            .entry(producer_id)
            .and_modify(|e| {
                if e.0 != expected {
                    *e = (expected, now);
                }
            })
            .or_insert((expected, now));
        debug_assert_eq!(at, expected);
        now.saturating_duration_since(since) < GAP_RETRY_WINDOW
    }

    /// A batch of `producer_id` was accepted: its gap, if any, is filled.
    fn filled(&mut self, producer_id: i64) {
        // Called for every accepted idempotent batch: nothing to look up, most of the time.
        if self.seen.is_empty() {
            return;
        }
        self.seen.remove(&producer_id);
    }
}

/// What to do with one proposal.
enum Prepared {
    Write(Proposal),
    /// Answered (a duplicate, a refused batch, not the leader).
    Answered,
}

impl Run {
    async fn run(mut self) {
        let mut held: Option<Proposal> = None;
        loop {
            let first = match held.take() {
                Some(p) => p,
                None => {
                    // Everything taken so far is written or answered.
                    lock(&self.shared.lane).done = self.last_taken;
                    match self.rx.recv().await {
                        Some(p) => p,
                        None => return,
                    }
                }
            };
            let first = match first.written {
                Some(w) => {
                    let p = Proposal {
                        written: None,
                        ..first
                    };
                    self.propose(vec![p], w.payload, w.term, w.slot).await;
                    continue;
                }
                None => first,
            };
            // Proposing every request at once would give each its own entry (and each its own
            // round of AppendEntries); waiting for a free slot lets the requests that arrive
            // meanwhile join the next entry.
            let Ok(slot) = Arc::clone(&self.slots).acquire_owned().await else {
                return;
            };
            // Looked at only now that a slot is free: a producer that gave up while it waited
            // is not written.
            let Some(first) = self.taken(first) else {
                continue;
            };
            if let Err(e) = self.ensure_leading().await {
                let _ = first.reply.send(Err(e));
                self.refuse_queued();
                continue;
            }
            let first = match prepare(
                &mut lock(&self.shared.lane),
                first,
                &self.shared.state,
                &self.shared.raft,
            ) {
                Prepared::Write(p) => p,
                Prepared::Answered => continue,
            };
            let mut size = first.len();
            let is_command = matches!(first.what, What::Command(_));
            let mut group = vec![first];
            // Join what is already queued, in order, up to the entry size bound; a command goes
            // in an entry of its own.
            while size < self.max_entry_bytes && !is_command {
                match self.rx.try_recv() {
                    Ok(next) if matches!(next.what, What::Command(_)) || next.written.is_some() => {
                        held = Some(next);
                        break;
                    }
                    Ok(next) => {
                        let Some(next) = self.taken(next) else {
                            continue;
                        };
                        if let Prepared::Write(next) = prepare(
                            &mut lock(&self.shared.lane),
                            next,
                            &self.shared.state,
                            &self.shared.raft,
                        ) {
                            size += next.len();
                            group.push(next);
                        }
                    }
                    Err(_) => break,
                }
            }
            self.write(group, size, slot).await;
        }
    }

    /// A proposal taken off the queue: its bytes no longer count as queued, and it is dropped
    /// if nobody waits for its answer any more (the produce timed out and the client will
    /// retry): proposed now, it would be written behind the retry, twice.
    fn taken(&mut self, p: Proposal) -> Option<Proposal> {
        release(&self.queued, p.len());
        self.last_taken = p.seq;
        if p.abandonable && p.reply.is_closed() {
            tracing::debug!(
                bytes = p.len(),
                "dropping an append nobody waits for any more"
            );
            return None;
        }
        Some(p)
    }

    /// Makes sure this replica leads and `leading` is right for its term (see the module docs).
    async fn ensure_leading(&mut self) -> Result<(), PartitionError> {
        let (leader, term, state, lapsed) = {
            let m = self.shared.raft.metrics();
            let m = m.borrow();
            let lapsed = !lease_holds(&self.shared.liveness, m.current_term);
            (m.current_leader, m.current_term, m.state, lapsed)
        };
        // A leader whose lease lapsed (`liveness.rs`) proposes nothing: the entry could not
        // commit before another leader may lead, and `leadership_lost` would answer it at once.
        // Nor does one handing over: what it took before commits, nothing more is taken.
        if state != ServerState::Leader || lapsed || self.shared.liveness.handing_over(term) {
            lock(&self.shared.lane).leading = None;
            return Err(PartitionError::NotLeader { leader });
        }
        let stale = self.shared.stale.swap(false, Ordering::AcqRel);
        if !stale
            && lock(&self.shared.lane)
                .leading
                .as_ref()
                .is_some_and(|l| l.term == term)
        {
            return Ok(());
        }
        lock(&self.shared.lane).leading = None;
        // Nothing of this proposer's may be in flight (this call holds one slot).
        let others = u32::try_from(ENTRIES_IN_FLIGHT - 1).unwrap_or(u32::MAX);
        let Ok(all) = self.slots.acquire_many(others).await else {
            return Err(PartitionError::Stopped("the proposer stopped".into()));
        };
        // Everything in the log applied: what came before the term (the linearizable read
        // point), and entries of this proposer whose answer it stopped waiting for when a term
        // ended (`leadership_lost`), which are in the log ahead of this term's and may commit.
        let raft = self.shared.raft.clone();
        let caught_up = tokio::time::timeout(TERM_START_WAIT, async move {
            if let Err(e) = raft.ensure_linearizable().await {
                tracing::debug!(error = %e, "not the leader after all");
                return false;
            }
            // Looked at every `LEADERSHIP_POLL` (see `leadership_lost` for why not on the
            // metrics channel).
            let last = raft.metrics().borrow().last_log_index;
            loop {
                let applied = raft.metrics().borrow().last_applied.map(|l| l.index);
                if applied >= last {
                    return true;
                }
                tokio::time::sleep(LEADERSHIP_POLL).await;
            }
        })
        .await;
        drop(all);
        // The term read above may have ended meanwhile (this replica elected again in a later
        // one): the table and offsets would then be of the old term, and a write proposed as of
        // it would count as lost at once (`leadership_lost`) while it commits in the new one.
        let still = {
            let m = self.shared.raft.metrics();
            let m = m.borrow();
            m.state == ServerState::Leader && m.current_term == term
        };
        if caught_up != Ok(true) || !still {
            return Err(PartitionError::NotLeader { leader: None });
        }
        let (table, next_offset) = self.shared.state.producers();
        lock(&self.shared.lane).leading = Some(Leading {
            term,
            table,
            next_offset,
        });
        Ok(())
    }

    /// Answers every proposal already queued with NotLeader (they would fail the same way).
    fn refuse_queued(&mut self) {
        while let Ok(p) = self.rx.try_recv() {
            if p.written.is_none() {
                release(&self.queued, p.len());
                self.last_taken = p.seq;
            }
            let leader = self.shared.raft.metrics().borrow().current_leader;
            let _ = p.reply.send(Err(PartitionError::NotLeader { leader }));
        }
    }

    async fn write(
        &mut self,
        group: Vec<Proposal>,
        size: usize,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) {
        let payload = match &group[0].what {
            What::Command(c) => Payload::Command(*c),
            // Cloned: a request's records are a slice of its whole frame (other partitions'
            // batches, the request header), so the log must not stamp them in place, which
            // would let its cache hold the whole frame for them; the clone makes it copy.
            What::Records { batches, .. } if group.len() == 1 => {
                Payload::records(batches.clone(), group[0].records())
            }
            What::Records { .. } => {
                let mut joined = BytesMut::with_capacity(size);
                let mut records = 0u32;
                for p in &group {
                    if let What::Records {
                        batches,
                        records: n,
                    } = &p.what
                    {
                        joined.extend_from_slice(batches);
                        records = records.saturating_add(*n);
                    }
                }
                // Exactly the entry's bytes and held only by the entry: stamped in place.
                Payload::records(joined.freeze(), records)
            }
        };
        // `prepare` wrote nothing unless this replica was leading.
        let Some(term) = lock(&self.shared.lane).leading.as_ref().map(|l| l.term) else {
            unreachable!("a write prepared while not leading");
        };
        // Written into the log now, at the index Raft gives it next, so its fsync starts before
        // the Raft core takes it (`LogStore::write_ahead`).
        let id = self.shared.raft.metrics().borrow().id;
        let payload = self.shared.store.write_ahead(term, id, payload);
        self.propose(group, payload, term, slot).await;
    }

    /// Hands `payload`, the entry of `group` prepared in `term`, to Raft, and answers each
    /// proposal once it is committed (or its fate is unknown).
    async fn propose(
        &mut self,
        group: Vec<Proposal>,
        payload: Payload,
        term: u64,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) {
        // `client_write_ff` hands the entry to Raft before it returns, so entries enter the
        // log in the order of this loop; only the wait for the commit runs concurrently.
        let stale = self.shared.stale.clone();
        let metrics = self.shared.raft.metrics();
        let liveness = self.shared.liveness.clone();
        match self.shared.raft.client_write_ff(payload).await {
            Err(fatal) => {
                drop(slot);
                stale.store(true, Ordering::Release);
                let reason = fatal.to_string();
                for p in group {
                    let _ = p.reply.send(Err(PartitionError::Stopped(reason.clone())));
                }
            }
            Ok(committed) => {
                tokio::spawn(async move {
                    // openraft answers an entry when it is applied or cut, but not when a
                    // snapshot from a later leader replaces it (a deposed leader that fell
                    // behind the log start): then the answer never comes. Stop waiting once
                    // this replica no longer leads the term the entry was proposed in, so the
                    // slot comes back and the producer hears NOT_LEADER (the fate is unknown).
                    // Likewise once its lease lapses: a leader cut off from its quorum may never
                    // hear of the next term, and the write would wait forever.
                    let outcome = tokio::select! {
                        // Biased: the simulation replays exactly (and an answer beats a lost term).
                        biased;
                        outcome = committed => Some(outcome),
                        () = leadership_lost(metrics, term, &liveness) => None,
                    };
                    drop(slot);
                    let outcome = match outcome {
                        Some(Ok(Ok(resp))) => Ok(resp.data),
                        Some(Ok(Err(ClientWriteError::ForwardToLeader(f)))) => {
                            Err(PartitionError::NotLeader {
                                leader: f.leader_id,
                            })
                        }
                        Some(Ok(Err(e))) => Err(PartitionError::Stopped(e.to_string())),
                        // Raft dropped the request, or this replica stopped leading the term,
                        // before the entry's fate was known. It may still commit under the next
                        // leader.
                        Some(Err(_)) | None => Err(PartitionError::NotLeader { leader: None }),
                    };
                    if outcome.is_err() {
                        // Whether the entry commits is unknown: the producer table may hold
                        // batches that never will.
                        stale.store(true, Ordering::Release);
                    }
                    let mut base = match &outcome {
                        Ok(applied) => applied.base_offset,
                        Err(_) => 0,
                    };
                    for p in group {
                        let answer = match &outcome {
                            Ok(applied) => {
                                if let Some(expected) = p.expected_base.filter(|&e| e != base) {
                                    tracing::error!(expected, committed = base, "the proposer's offsets disagree with the committed ones; rebuilding its producer table");
                                    debug_assert_eq!(expected, base, "proposer offsets");
                                    stale.store(true, Ordering::Release);
                                }
                                let ack = AppendAck {
                                    base_offset: base,
                                    last_offset: base + i64::from(p.records()) - 1,
                                    leader_epoch: applied.leader_epoch,
                                };
                                base += i64::from(p.records());
                                Ok(ack)
                            }
                            Err(e) => Err(e.duplicate()),
                        };
                        let _ = p.reply.send(answer);
                    }
                });
            }
        }
    }
}

/// Checks a proposal's producer batches and assigns its offsets (see the module docs).
fn prepare(lane: &mut Lane, mut p: Proposal, state: &StateMachine, raft: &Raft) -> Prepared {
    let Some(leading) = lane.leading.as_mut() else {
        let _ = p
            .reply
            .send(Err(PartitionError::NotLeader { leader: None }));
        return Prepared::Answered;
    };
    let What::Records { batches, records } = &p.what else {
        return Prepared::Write(p);
    };
    let base = leading.next_offset;
    let offset = base + i64::from(*records);
    let producer_batches = Payload::producer_batches(batches, base);
    if !producer_batches.is_empty() {
        match check_all(&leading.table, &producer_batches) {
            Ok(None) => {
                for b in producer_batches {
                    lane.gaps.filled(b.producer_id);
                    leading.table.apply(b);
                }
            }
            Ok(Some((base_offset, last_offset))) => {
                let term = leading.term;
                answer_duplicate(p, base_offset, last_offset, term, state, raft);
                return Prepared::Answered;
            }
            Err(PartitionError::OutOfOrderSequence {
                producer_id,
                expected,
                got,
            }) if expected >= 0
                && sequence_ahead(expected, got)
                && same_epoch(&leading.table, &producer_batches, producer_id)
                && lane
                    .gaps
                    .retriable(producer_id, expected, tokio::time::Instant::now()) =>
            {
                let _ = p.reply.send(Err(PartitionError::EarlierBatchUnwritten {
                    producer_id,
                    expected,
                    got,
                }));
                return Prepared::Answered;
            }
            Err(e) => {
                let _ = p.reply.send(Err(e));
                return Prepared::Answered;
            }
        }
    }
    leading.next_offset = offset;
    p.expected_base = Some(base);
    Prepared::Write(p)
}

/// A retry of a batch already written in this term or before: answered with its offsets
/// once they are committed, as long as this replica still leads the same term (then the
/// entry is the one it wrote, not another leader's at the same offsets).
fn answer_duplicate(
    p: Proposal,
    base_offset: i64,
    last_offset: i64,
    term: u64,
    state: &StateMachine,
    raft: &Raft,
) {
    let mut high_watermark = state.subscribe_high_watermark();
    let mut metrics = raft.metrics();
    tokio::spawn(async move {
        let wait = async {
            loop {
                let (state, now_term) = {
                    let m = metrics.borrow_and_update();
                    (m.state, m.current_term)
                };
                if state != ServerState::Leader || now_term != term {
                    return false;
                }
                if *high_watermark.borrow_and_update() > last_offset {
                    return true;
                }
                tokio::select! {
                    biased;
                    changed = high_watermark.changed() => if changed.is_err() { return false },
                    changed = metrics.changed() => if changed.is_err() { return false },
                }
            }
        };
        let answer = match tokio::time::timeout(DUPLICATE_WAIT, wait).await {
            Ok(true) => Ok(AppendAck {
                base_offset,
                last_offset,
                leader_epoch: term,
            }),
            _ => Err(PartitionError::NotLeader { leader: None }),
        };
        let _ = p.reply.send(answer);
    });
}

/// Resolves once the Raft node no longer leads `term`, or stopped, or its lease lapsed (a
/// quorum acknowledged nothing it sent in the last lease: `liveness.rs`). It looks every
/// [`LEADERSHIP_POLL`] rather than waiting on the metrics channel: a tokio `watch` wakes its
/// waiters in a random order, which would make the simulation's replays differ, and a few
/// timers per partition with writes in flight cost nothing.
async fn leadership_lost(
    metrics: tokio::sync::watch::Receiver<
        openraft::RaftMetrics<crate::types::NodeId, openraft::EmptyNode>,
    >,
    term: u64,
    liveness: &Liveness,
) {
    loop {
        tokio::time::sleep(LEADERSHIP_POLL).await;
        if metrics.has_changed().is_err() {
            return;
        }
        let m = metrics.borrow();
        if m.state != ServerState::Leader || m.current_term != term || !lease_holds(liveness, term)
        {
            return;
        }
    }
}

/// Whether the lease of a leader of `term` holds now (`Liveness::leads`).
fn lease_holds(liveness: &Liveness, term: u64) -> bool {
    liveness.leads(term, tokio::time::Instant::now())
}

/// Whether `producer_id`'s batch among `batches` is of the epoch `table` holds for it (a gap
/// within an epoch, not a new epoch that fails to start at 0).
fn same_epoch(table: &ProducerTable, batches: &[ProducerBatch], producer_id: i64) -> bool {
    let epoch = batches
        .iter()
        .find(|b| b.producer_id == producer_id)
        .map(|b| b.producer_epoch);
    epoch.is_some() && epoch == table.epoch(producer_id)
}

/// The verdict on a proposal's producer batches, in order, against `table` and each other:
/// `Ok(None)` to append them all; `Ok(Some((base, last)))` when they are all retries (answer
/// with those offsets); an error for a batch out of sequence, of a fenced epoch or of an
/// unknown producer past sequence 0, or retries mixed with new batches (a well-behaved
/// producer never sends that).
fn check_all(
    table: &ProducerTable,
    batches: &[ProducerBatch],
) -> Result<Option<(i64, i64)>, PartitionError> {
    let ids: BTreeSet<i64> = batches.iter().map(|b| b.producer_id).collect();
    let mut staged = table.subset(&ids);
    let mut duplicate: Option<(i64, i64)> = None;
    for (i, b) in batches.iter().enumerate() {
        match staged.check(b) {
            Verdict::Append if duplicate.is_none() => staged.apply(*b),
            Verdict::Duplicate {
                base_offset,
                last_offset,
            } if i == 0 || duplicate.is_some() => {
                let base = duplicate.map_or(base_offset, |(first, _)| first);
                duplicate = Some((base, last_offset));
            }
            Verdict::Append | Verdict::Duplicate { .. } => {
                return Err(PartitionError::OutOfOrderSequence {
                    producer_id: b.producer_id,
                    expected: -1,
                    got: b.base_sequence,
                })
            }
            Verdict::OutOfOrder { expected, got } => {
                return Err(PartitionError::OutOfOrderSequence {
                    producer_id: b.producer_id,
                    expected,
                    got,
                })
            }
            Verdict::InvalidEpoch { current, got } => {
                return Err(PartitionError::InvalidProducerEpoch {
                    producer_id: b.producer_id,
                    current,
                    got,
                })
            }
            Verdict::UnknownProducer { got } => {
                return Err(PartitionError::UnknownProducerId {
                    producer_id: b.producer_id,
                    got,
                })
            }
        }
    }
    Ok(duplicate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_retried_for_a_window_then_counts_as_real() {
        let mut gaps = Gaps::default();
        let t0 = tokio::time::Instant::now();
        assert!(gaps.retriable(7, 10, t0));
        assert!(gaps.retriable(7, 10, t0 + GAP_RETRY_WINDOW / 2));
        assert!(!gaps.retriable(7, 10, t0 + GAP_RETRY_WINDOW));
        // Filled (the earlier batch came), a later gap starts a new window.
        gaps.filled(7);
        assert!(gaps.retriable(7, 20, t0 + GAP_RETRY_WINDOW * 2));
        // A gap at another sequence is a new one.
        assert!(gaps.retriable(7, 30, t0 + GAP_RETRY_WINDOW * 4));
        assert!(!gaps.retriable(7, 30, t0 + GAP_RETRY_WINDOW * 5));
        // Producers are apart.
        assert!(gaps.retriable(8, 30, t0 + GAP_RETRY_WINDOW * 5));
    }

    #[test]
    fn the_gaps_kept_are_bounded() {
        let mut gaps = Gaps::default();
        let t0 = tokio::time::Instant::now();
        for id in 0..(GAPS_MAX as i64 + 5) {
            assert!(gaps.retriable(id, 1, t0));
            assert!(gaps.seen.len() <= GAPS_MAX);
        }
    }
}
