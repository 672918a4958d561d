//! One connection per peer, shared by every Raft group of a broker.
//!
//! A broker's groups (one per partition replica, plus the metadata and offsets groups) all send
//! to the same few peers. [`Mesh`] keeps one [`Conn`] per peer for all of them: requests carry
//! an id (`codec.rs`), one writer task sends every group's frames in the order they are queued,
//! and one reader task hands each response to the request with its id, in whatever order the
//! peer answers. The frames queued while the writer was busy go out in one write, so the
//! heartbeats of many groups to one peer cost one system call, not one each.
//!
//! Bounds, and why each is enough:
//! - [`OUTBOX_BYTES_MAX`]: bytes queued for one peer and not yet written. A request waits for
//!   room (within its deadline) rather than growing the queue; a frame larger than the whole
//!   bound waits for the queue to drain and then goes alone.
//! - [`IN_FLIGHT_MAX`]: requests awaiting an answer on one connection. Every openraft link
//!   has at most one RPC outstanding, so this is reached only with far more groups than a
//!   broker is sized for; past it a request fails at once as unreachable (openraft retries).
//! - A group's own traffic is bounded by openraft (one RPC per link at a time, at most
//!   `max_payload_entries` entries each), so one busy group delays another only by the frames
//!   queued ahead of it, never by waiting for its answers.
//!
//! Failure: a connect that failed is not retried for [`RECONNECT_PAUSE`], so a dead peer costs a
//! few attempts a second for the whole broker instead of one per group. A write error, a read
//! error or end of stream closes the connection and fails every request waiting on it; the next
//! request connects again. A request that times out when nothing at all has arrived on its
//! connection for [`SILENCE_MAX`] closes the connection too: the peer is gone (a host that died
//! without closing its end) or stuck, and a fresh connection is the only way to tell which. A
//! peer that is merely slow (a loaded broker answering votes late) still answers something
//! within that time and keeps its connection: closing it would fail every group's requests at
//! once and make the load worse.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::codec::{self, Frame, Message};
use super::transport::{BoxStream, Transport};
use super::PeerAddrs;
use crate::types::NodeId;

/// Bytes queued for one peer and not yet written (see the module docs).
pub const OUTBOX_BYTES_MAX: usize = 64 << 20;

/// Requests awaiting an answer on one connection (see the module docs).
pub const IN_FLIGHT_MAX: usize = 16_384;

/// How long after a failed connect the next attempt to that peer waits; requests in between
/// fail at once with the failure's reason.
pub const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// A connection on which nothing has arrived for this long is closed when a request on it
/// times out (see the module docs). Heartbeats answer every 100 ms on a live one.
pub const SILENCE_MAX: Duration = Duration::from_secs(3);

/// Longest one write of queued frames may take before the peer counts as gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The writer's buffer: frames queued together are copied into it and written at once.
const WRITE_BUFFER_BYTES: usize = 256 << 10;

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum MuxError {
    /// Not connected, the connection broke, or the peer closed it.
    Unreachable(String),
    /// Sent (or queued), but no answer in time.
    Timeout,
    /// The request would not fit in one frame.
    TooLarge,
}

/// A broker's connections to its peers, one per peer, made on first use.
pub struct Mesh {
    /// Where each peer listens: replaced whole when the cluster's membership changes
    /// ([`Mesh::set_peers`]).
    peers: std::sync::RwLock<PeerAddrs>,
    transport: Transport,
    connect_timeout: Duration,
    lanes: Mutex<BTreeMap<NodeId, Arc<Lane>>>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("peers", &self.peers())
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

impl Mesh {
    /// Connections to `peers` over `transport`, each made within `connect_timeout`.
    pub fn new(peers: PeerAddrs, transport: Transport, connect_timeout: Duration) -> Self {
        Mesh {
            peers: std::sync::RwLock::new(peers),
            transport,
            connect_timeout,
            lanes: Mutex::new(BTreeMap::new()),
        }
    }

    /// Where each peer listens, as of now.
    pub fn peers(&self) -> PeerAddrs {
        self.peers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the peers' addresses (a broker joined, left or moved). A peer whose address
    /// changed gets a new connection on its next use; the old one is dropped with its lane,
    /// once its calls in flight end.
    pub fn set_peers(&self, peers: PeerAddrs) {
        let old = std::mem::replace(
            &mut *self.peers.write().unwrap_or_else(PoisonError::into_inner),
            peers.clone(),
        );
        let mut lanes = self.lock();
        lanes.retain(|node, _| old.get(node) == peers.get(node));
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Open connections (one per peer at most); for tests and metrics.
    pub fn connections(&self) -> usize {
        self.lock()
            .values()
            .filter(|lane| lane.current().is_some())
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, Arc<Lane>>> {
        // Single inserts and removes: a panic elsewhere leaves the map whole.
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lane(&self, target: NodeId) -> Arc<Lane> {
        self.lock()
            .entry(target)
            .or_insert_with(|| {
                Arc::new(Lane {
                    target,
                    addr: self.peers().get(&target).cloned(),
                    transport: self.transport.clone(),
                    connect_timeout: self.connect_timeout,
                    state: tokio::sync::Mutex::new(LaneState::default()),
                    conn: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Sends `message` for `group` to node `target` and waits for the answer until `deadline`.
    pub(crate) async fn call(
        &self,
        target: NodeId,
        group: &str,
        message: &Message,
        deadline: Instant,
    ) -> Result<Frame, MuxError> {
        let lane = self.lane(target);
        let conn = lane.connect(deadline).await?;
        conn.call(group, message, deadline).await
    }
}

/// The connection to one peer, replaced after it breaks.
struct Lane {
    target: NodeId,
    addr: Option<String>,
    transport: Transport,
    connect_timeout: Duration,
    /// Held while connecting, so one request connects and the others wait for it.
    state: tokio::sync::Mutex<LaneState>,
    /// The open connection, read without waiting on a connect in progress.
    conn: Mutex<Option<Arc<Conn>>>,
}

#[derive(Default)]
struct LaneState {
    /// The last failed connect: when, and why.
    failed: Option<(Instant, String)>,
}

impl Lane {
    fn current(&self) -> Option<Arc<Conn>> {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.as_ref().filter(|c| !c.closed()).cloned()
    }

    async fn connect(&self, deadline: Instant) -> Result<Arc<Conn>, MuxError> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let mut state = match tokio::time::timeout_at(deadline, self.state.lock()).await {
            Ok(state) => state,
            Err(_) => return Err(MuxError::Timeout),
        };
        // Another request may have connected while this one waited.
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        if let Some((at, reason)) = &state.failed {
            if at.elapsed() < RECONNECT_PAUSE {
                return Err(MuxError::Unreachable(reason.clone()));
            }
        }
        let Some(addr) = self.addr.as_deref() else {
            return Err(MuxError::Unreachable(format!(
                "no address for node {}",
                self.target
            )));
        };
        let limit = self
            .connect_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        match self.transport.connect(addr, self.target, limit).await {
            Ok(stream) => {
                state.failed = None;
                let conn = Conn::start(stream, self.target);
                *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
                tracing::debug!(target_node = self.target, %addr, "raft connection open");
                Ok(conn)
            }
            Err(reason) => {
                state.failed = Some((Instant::now(), reason.clone()));
                Err(MuxError::Unreachable(reason))
            }
        }
    }
}

type Reply = Result<Frame, String>;

/// A frame on its way to the writer, with the queue room it holds until written.
struct Outgoing {
    bytes: Vec<u8>,
    _room: OwnedSemaphorePermit,
}

/// One open connection: its request ids, the requests awaiting answers, and its two tasks.
struct Conn {
    target: NodeId,
    outbox: mpsc::UnboundedSender<Outgoing>,
    /// Bytes of room in the outbox ([`OUTBOX_BYTES_MAX`] in all).
    room: Arc<Semaphore>,
    pending: Mutex<HashMap<u32, oneshot::Sender<Reply>>>,
    next_id: AtomicU32,
    /// When the connection opened; `heard_ms` counts from here.
    opened: Instant,
    /// Milliseconds after `opened` of the last frame read (0 until one is).
    heard_ms: AtomicU64,
    closed: AtomicBool,
    /// Why it closed, set once with `closed`: a request that finds the connection closed
    /// fails with the reason (a TLS refusal can close it before the first request is sent).
    close_reason: std::sync::OnceLock<String>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Conn {
    fn start(stream: BoxStream, target: NodeId) -> Arc<Conn> {
        let (read, write) = tokio::io::split(stream);
        // The outbox is bounded by `room` in bytes, not by a count of frames: a count would
        // either refuse heartbeats behind a few large appends or admit gigabytes of appends.
        let (outbox, queued) = mpsc::unbounded_channel();
        let conn = Arc::new(Conn {
            target,
            outbox,
            room: Arc::new(Semaphore::new(OUTBOX_BYTES_MAX)),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(1),
            opened: Instant::now(),
            heard_ms: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            close_reason: std::sync::OnceLock::new(),
            tasks: Mutex::new(Vec::new()),
        });
        let writer = tokio::spawn(write_loop(Arc::downgrade(&conn), write, queued));
        let reader = tokio::spawn(read_loop(Arc::downgrade(&conn), read));
        conn.tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend([writer, reader]);
        conn
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The error for a request that finds the connection closed: why it closed.
    fn closed_error(&self) -> MuxError {
        let reason = self
            .close_reason
            .get()
            .map_or("connection closed", String::as_str);
        MuxError::Unreachable(reason.to_string())
    }

    /// How long since the last frame arrived (since the connection opened, if none has).
    fn silent_for(&self) -> Duration {
        let heard = Duration::from_millis(self.heard_ms.load(Ordering::Acquire));
        self.opened.elapsed().saturating_sub(heard)
    }

    fn heard(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.heard_ms.fetch_max(ms, Ordering::AcqRel);
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u32, oneshot::Sender<Reply>>> {
        // Single inserts and removes: a panic elsewhere leaves the map whole.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the connection closed, fails every request waiting on it with `reason`, and stops
    /// its tasks (which closes the stream).
    fn close(&self, reason: &str) {
        // The reason first: whoever sees `closed` set finds it.
        let _ = self.close_reason.set(reason.to_string());
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(target_node = self.target, %reason, "raft connection closed");
        let waiting: Vec<_> = self.pending().drain().map(|(_, tx)| tx).collect();
        for tx in waiting {
            let _ = tx.send(Err(reason.to_string()));
        }
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
    }

    async fn call(
        &self,
        group: &str,
        message: &Message,
        deadline: Instant,
    ) -> Result<Frame, MuxError> {
        // Ids wrap after 2^32 requests; by then the request that last held an id is long
        // answered or timed out. 0 is left to one-off exchanges.
        let mut id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            id = self.next_id.fetch_add(1, Ordering::Relaxed);
        }
        let bytes = match codec::encode(id, group, message) {
            Ok(bytes) => bytes,
            Err(codec::CodecError::TooLarge { .. }) => return Err(MuxError::TooLarge),
            Err(e) => return Err(MuxError::Unreachable(e.to_string())),
        };
        // A frame larger than the whole outbox waits for all of it, then goes alone.
        let want = u32::try_from(bytes.len().min(OUTBOX_BYTES_MAX)).unwrap_or(u32::MAX);
        let room =
            match tokio::time::timeout_at(deadline, self.room.clone().acquire_many_owned(want))
                .await
            {
                Ok(Ok(room)) => room,
                Ok(Err(_)) => unreachable!("a connection's outbox semaphore is never closed"),
                Err(_) => return Err(MuxError::Timeout),
            };
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending();
            // Checked under the lock `close` drains: a request registered after it would wait
            // for an answer that cannot come.
            if self.closed() {
                return Err(self.closed_error());
            }
            if pending.len() >= IN_FLIGHT_MAX {
                return Err(MuxError::Unreachable(format!(
                    "{IN_FLIGHT_MAX} requests already await answers from node {}",
                    self.target
                )));
            }
            let previous = pending.insert(id, tx);
            assert!(previous.is_none(), "request id {id} is in use twice");
        }
        if self.outbox.send(Outgoing { bytes, _room: room }).is_err() {
            self.pending().remove(&id);
            return Err(self.closed_error());
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(Ok(frame))) => Ok(frame),
            Ok(Ok(Err(reason))) => Err(MuxError::Unreachable(reason)),
            Ok(Err(_)) => Err(self.closed_error()),
            Err(_) => {
                self.pending().remove(&id);
                if self.silent_for() >= SILENCE_MAX {
                    self.close(&format!(
                        "nothing heard from the peer for {:?}",
                        self.silent_for()
                    ));
                }
                Err(MuxError::Timeout)
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The tasks hold only weak references; stop them with the last strong one.
        self.close("connection dropped");
    }
}

async fn write_loop(
    conn: std::sync::Weak<Conn>,
    write: tokio::io::WriteHalf<BoxStream>,
    mut queued: mpsc::UnboundedReceiver<Outgoing>,
) {
    let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, write);
    while let Some(first) = queued.recv().await {
        let batch = async {
            out.write_all(&first.bytes).await?;
            drop(first);
            // Whatever else is queued goes in the same write: BufWriter writes through once
            // its buffer is full, and the flush sends the rest.
            while let Ok(next) = queued.try_recv() {
                out.write_all(&next.bytes).await?;
            }
            out.flush().await
        };
        let failure = match tokio::time::timeout(WRITE_TIMEOUT, batch).await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => format!("write failed: {e}"),
            Err(_) => format!("a write took over {WRITE_TIMEOUT:?}"),
        };
        if let Some(conn) = conn.upgrade() {
            conn.close(&failure);
        }
        return;
    }
}

async fn read_loop(conn: std::sync::Weak<Conn>, mut read: tokio::io::ReadHalf<BoxStream>) {
    let failure = loop {
        let frame = match codec::read_frame(&mut read).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break "connection closed by the peer".to_string(),
            Err(e) => break format!("bad frame from the peer: {e}"),
        };
        let Some(conn) = conn.upgrade() else { return };
        conn.heard();
        if frame.id == 0 {
            // The server answers a frame it could not read with id 0 and closes its end.
            let reason = match &frame.message {
                Message::Error(reason) => format!("peer refused: {reason}"),
                other => format!("protocol error: unsolicited {other:?}"),
            };
            conn.close(&reason);
            return;
        }
        // None: the request timed out and went away; its late answer is dropped.
        let waiting = conn.pending().remove(&frame.id);
        if let Some(tx) = waiting {
            let _ = tx.send(Ok(frame));
        }
    };
    if let Some(conn) = conn.upgrade() {
        conn.close(&failure);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use tokio::net::TcpListener;

    use super::*;

    /// A vote request, the smallest request there is.
    fn vote() -> Message {
        Message::Vote {
            target: 2,
            rpc: openraft::raft::VoteRequest::new(crate::types::Vote::new(1, 1), None),
        }
    }

    async fn mesh_to_listener() -> (Arc<Mesh>, TcpListener) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let peers = Arc::new(BTreeMap::from([(2, addr)]));
        let mesh = Mesh::new(peers, Transport::Plain, Duration::from_secs(1));
        (Arc::new(mesh), listener)
    }

    async fn answer(stream: &mut tokio::net::TcpStream, id: u32, group: &str, reason: &str) {
        let bytes = codec::encode(id, group, &Message::Error(reason.into())).unwrap();
        stream.write_all(&bytes).await.unwrap();
    }

    /// Two groups' requests on one connection, answered in the reverse order: each caller gets
    /// its own answer.
    #[tokio::test]
    async fn answers_find_their_requests_in_any_order() {
        let (mesh, listener) = mesh_to_listener().await;
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let a = codec::read_frame(&mut stream).await.unwrap().unwrap();
            let b = codec::read_frame(&mut stream).await.unwrap().unwrap();
            answer(&mut stream, b.id, &b.group, &format!("for {}", b.group)).await;
            answer(&mut stream, a.id, &a.group, &format!("for {}", a.group)).await;
            // A second connection would be a bug: the listener is gone once this returns.
            stream
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let (m1, m2) = (mesh.clone(), mesh.clone());
        let first = tokio::spawn(async move { m1.call(2, "a/0", &vote(), deadline).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = tokio::spawn(async move { m2.call(2, "b/0", &vote(), deadline).await });
        for (call, group) in [(first, "a/0"), (second, "b/0")] {
            let frame = call.await.unwrap().unwrap();
            assert_eq!(frame.group, group);
            assert!(matches!(frame.message, Message::Error(r) if r == format!("for {group}")));
        }
        assert_eq!(mesh.connections(), 1);
        drop(server.await.unwrap());
    }

    /// A request the peer never answers times out alone while the peer answers others: the
    /// connection stays, and the late answer, when it comes, is dropped.
    #[tokio::test]
    async fn one_unanswered_request_times_out_without_closing_the_connection() {
        let (mesh, listener) = mesh_to_listener().await;
        let (go, wait) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let slow = codec::read_frame(&mut stream).await.unwrap().unwrap();
            let quick = codec::read_frame(&mut stream).await.unwrap().unwrap();
            answer(&mut stream, quick.id, &quick.group, "quick").await;
            wait.await.unwrap();
            answer(&mut stream, slow.id, &slow.group, "late").await;
            let again = codec::read_frame(&mut stream).await.unwrap().unwrap();
            answer(&mut stream, again.id, &again.group, "again").await;
            stream
        });
        let m = mesh.clone();
        let slow = tokio::spawn(async move {
            m.call(
                2,
                "slow/0",
                &vote(),
                Instant::now() + Duration::from_millis(300),
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let quick = mesh
            .call(
                2,
                "quick/0",
                &vote(),
                Instant::now() + Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert!(matches!(quick.message, Message::Error(r) if r == "quick"));
        assert!(matches!(slow.await.unwrap(), Err(MuxError::Timeout)));
        assert_eq!(
            mesh.connections(),
            1,
            "the peer was heard from: the connection stays"
        );
        go.send(()).unwrap();
        let again = mesh
            .call(
                2,
                "again/0",
                &vote(),
                Instant::now() + Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert!(matches!(again.message, Message::Error(r) if r == "again"));
        drop(server.await.unwrap());
    }

    /// A peer that reads but never answers: requests time out, the connection stays until
    /// nothing has been heard on it for `SILENCE_MAX` and is closed at the next timeout, and the
    /// next request connects afresh.
    #[tokio::test]
    async fn a_silent_peer_costs_its_connection() {
        let (mesh, listener) = mesh_to_listener().await;
        let server = tokio::spawn(async move {
            let (mut silent, _) = listener.accept().await.unwrap();
            let _ignored = codec::read_frame(&mut silent).await.unwrap().unwrap();
            let (mut fresh, _) = listener.accept().await.unwrap();
            let request = codec::read_frame(&mut fresh).await.unwrap().unwrap();
            answer(&mut fresh, request.id, &request.group, "fresh").await;
            (silent, fresh)
        });
        let timed_out = mesh
            .call(
                2,
                "a/0",
                &vote(),
                Instant::now() + Duration::from_millis(200),
            )
            .await;
        assert!(matches!(timed_out, Err(MuxError::Timeout)));
        assert_eq!(
            mesh.connections(),
            1,
            "a slow peer keeps its connection a while"
        );
        tokio::time::sleep(SILENCE_MAX).await;
        let timed_out = mesh
            .call(
                2,
                "a/0",
                &vote(),
                Instant::now() + Duration::from_millis(200),
            )
            .await;
        assert!(matches!(timed_out, Err(MuxError::Timeout)));
        assert_eq!(mesh.connections(), 0);
        let fresh = mesh
            .call(2, "a/0", &vote(), Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(matches!(fresh.message, Message::Error(r) if r == "fresh"));
        drop(server.await.unwrap());
    }

    /// A refused connect is not retried for every request: within the pause, requests fail at
    /// once with the first failure's reason.
    #[tokio::test]
    async fn a_refused_connect_is_retried_once_per_pause() {
        let (mesh, listener) = mesh_to_listener().await;
        drop(listener);
        let deadline = Instant::now() + Duration::from_secs(5);
        let first = mesh.call(2, "a/0", &vote(), deadline).await;
        let Err(MuxError::Unreachable(reason)) = first else {
            panic!("expected unreachable, got {first:?}");
        };
        let started = Instant::now();
        for group in ["b/0", "c/0", "d/0"] {
            let again = mesh.call(2, group, &vote(), deadline).await;
            assert!(
                matches!(&again, Err(MuxError::Unreachable(r)) if *r == reason),
                "{again:?}"
            );
        }
        assert!(started.elapsed() < RECONNECT_PAUSE);
    }

    /// The server closes a connection after an id-0 error (a frame it could not read): every
    /// request waiting on it fails at once instead of timing out.
    #[tokio::test]
    async fn an_id_zero_error_fails_everything_waiting() {
        let (mesh, listener) = mesh_to_listener().await;
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let _ = codec::read_frame(&mut stream).await.unwrap().unwrap();
            answer(&mut stream, 0, "", "bad frame: test").await;
            stream
        });
        let failed = mesh
            .call(2, "a/0", &vote(), Instant::now() + Duration::from_secs(5))
            .await;
        assert!(
            matches!(&failed, Err(MuxError::Unreachable(r)) if r.contains("bad frame: test")),
            "{failed:?}"
        );
        assert_eq!(mesh.connections(), 0);
        drop(server.await.unwrap());
    }
}
