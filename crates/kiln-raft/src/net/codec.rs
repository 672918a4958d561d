//! The wire format of Raft RPCs between brokers.
//!
//! Frame: `[len u32 BE][crc32c u32 BE of the body][body; len bytes]`.
//! Body: `[kind u8][request id u32 BE][group-name length u16 BE][group name, UTF-8][payload]`.
//!
//! The request id pairs a response with its request: many groups' RPCs share one connection
//! (`net/mux.rs`) and their answers come back in the order they are ready, not the order they
//! were asked. A response carries its request's id; one-off exchanges (hello, forward) use 0.
//!
//! | kind | message | payload |
//! |---|---|---|
//! | 1 | AppendEntries request | `target u64, vote, prev_log_id?, leader_commit?, count u32, count × [len u32, entry]` |
//! | 2 | AppendEntries response | `tag u8`: 0 Success, 1 PartialSuccess + `log_id?`, 2 Conflict, 3 HigherVote + `vote` |
//! | 3 | Vote request | `target u64, vote, last_log_id?` |
//! | 4 | Vote response | `vote, granted u8, last_log_id?` |
//! | 5 | Error response | the reason, UTF-8 |
//! | 6 | InstallSnapshot request | `target u64, vote, last_log_id?, membership_log_id?, membership, id len u16, id, offset u64, done u8, data` |
//! | 7 | InstallSnapshot response | `vote` |
//! | 8 | Hello request | `sender u64, incarnation u64` (group name empty) |
//! | 9 | Hello response | `node u64, registered u8, incarnation u64, has_cluster u8, cluster id (UTF-8, the rest)` |
//! | 10 | Forward request | `payload` (the rest): a proposal for the group's leader to make |
//! | 11 | Forward response | `ok u8`, then the answer (ok) or the reason (UTF-8), the rest |
//! | 12 | Beat request | `sender u64, count u32, count × [name length u16, group name, term u64, applied log_id?]` (group name empty) |
//! | 13 | Beat response | `count u32, count × flags u8` (bit 0 accepted, bit 1 caught up), in the request's order |
//!
//! `vote` is `term u64, has_node u8, node u64, committed u8`; a membership is `record.rs`'s
//! encoding, the one kept on disk. `log_id?` is `0u8`, or `1u8, term u64, index u64`. An entry
//! is `term u64, index u64, kind u8`, then for kind 0 (blank) nothing, 1 (records)
//! `kafka_offset i64 (i64::MIN: none), record_count u32, batches`, 2 (membership) the
//! membership, 3 (command) the command's bytes. Records are validated on decode (CRC32C, counts),
//! so a peer's bad bytes are refused here and never reach a log. `target` is the node the sender
//! means to reach, so a peer address that points at the wrong broker is refused instead of a
//! vote or an acknowledgement being counted for the wrong node.
//!
//! Decoding never trusts a length: a frame over [`MAX_FRAME_BYTES`], a bad CRC, a short or
//! over-long payload, an unknown kind or tag, all are errors, never a panic.

use std::fmt;
use std::io;

use bytes::Bytes;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{CommittedLeaderId, EntryPayload, SnapshotMeta, StoredMembership};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{Hello, HelloAnswer};
use crate::payload::{Command, Payload};
use crate::pulse::{BeatAnswer, BeatItem, BEAT_ITEMS_MAX};
use crate::record::{
    decode_membership, decode_vote, encode_membership, encode_vote_payload, VOTE_BYTES,
};
use crate::types::{Entry, KilnRaft, LogId, NodeId, Vote};

/// Largest frame body accepted or sent. An AppendEntries carries at most
/// `max_payload_entries` (64) entries, each one produce request's batches, so this is far
/// above any legitimate frame; a length past it is a corrupt or foreign stream.
pub const MAX_FRAME_BYTES: usize = 256 << 20;

/// Largest body of every kind but AppendEntries, InstallSnapshot and Forward: those carry
/// only ids, votes, log ids and short texts (a group name is at most 64 KiB). Checked on the
/// kind byte before the rest of the body is read, so a peer cannot make a vote cost 256 MiB.
pub const CONTROL_FRAME_BYTES: usize = 1 << 20;

/// Longest reason an Error or Forward response carries; longer ones are cut at a character
/// boundary (a reason is for a log line).
const REASON_BYTES_MAX: usize = 4096;

/// The largest body a frame of `kind` may have; `None` for a kind this protocol lacks.
pub fn frame_bytes_max(kind: u8) -> Option<usize> {
    match kind {
        KIND_APPEND | KIND_SNAPSHOT | KIND_FORWARD => Some(MAX_FRAME_BYTES),
        KIND_APPEND_RESPONSE
        | KIND_VOTE
        | KIND_VOTE_RESPONSE
        | KIND_ERROR
        | KIND_SNAPSHOT_RESPONSE
        | KIND_HELLO
        | KIND_HELLO_RESPONSE
        | KIND_FORWARD_RESPONSE
        | KIND_BEAT
        | KIND_BEAT_RESPONSE => Some(CONTROL_FRAME_BYTES),
        _ => None,
    }
}

fn reason_bytes(reason: &str) -> &[u8] {
    if reason.len() <= REASON_BYTES_MAX {
        return reason.as_bytes();
    }
    let mut end = REASON_BYTES_MAX;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason.as_bytes()[..end]
}

const HEADER: usize = 8;
/// Kind byte, request id and group-name length: the least a body holds.
const MIN_BODY: usize = 7;

pub(crate) const KIND_APPEND: u8 = 1;
pub(crate) const KIND_APPEND_RESPONSE: u8 = 2;
pub(crate) const KIND_VOTE: u8 = 3;
pub(crate) const KIND_VOTE_RESPONSE: u8 = 4;
pub(crate) const KIND_ERROR: u8 = 5;
pub(crate) const KIND_SNAPSHOT: u8 = 6;
pub(crate) const KIND_SNAPSHOT_RESPONSE: u8 = 7;
pub(crate) const KIND_HELLO: u8 = 8;
pub(crate) const KIND_HELLO_RESPONSE: u8 = 9;
pub(crate) const KIND_FORWARD: u8 = 10;
pub(crate) const KIND_FORWARD_RESPONSE: u8 = 11;
pub(crate) const KIND_BEAT: u8 = 12;
pub(crate) const KIND_BEAT_RESPONSE: u8 = 13;

/// Longest group name in a beat item (the broker's are a topic id and a partition number).
pub const BEAT_GROUP_NAME_MAX: usize = 256;

const BEAT_ACCEPTED: u8 = 1;
const BEAT_CAUGHT_UP: u8 = 2;

const ENTRY_BLANK: u8 = 0;
const ENTRY_RECORDS: u8 = 1;
const ENTRY_MEMBERSHIP: u8 = 2;
const ENTRY_COMMAND: u8 = 3;

/// Why a frame could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("frame of {len} bytes is over the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error(
        "frame checksum mismatch: header says crc32c {expected:#010x}, body has {actual:#010x}"
    )]
    BadCrc { expected: u32, actual: u32 },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

fn malformed(what: impl Into<String>) -> CodecError {
    CodecError::Malformed(what.into())
}

/// One RPC message.
pub enum Message {
    /// AppendEntries for the replica with node id `target`.
    AppendEntries {
        target: NodeId,
        rpc: AppendEntriesRequest<KilnRaft>,
    },
    AppendEntriesResponse(AppendEntriesResponse<NodeId>),
    /// Vote request for the replica with node id `target`.
    Vote {
        target: NodeId,
        rpc: VoteRequest<NodeId>,
    },
    VoteResponse(VoteResponse<NodeId>),
    /// One chunk of a snapshot for the replica with node id `target`.
    InstallSnapshot {
        target: NodeId,
        rpc: InstallSnapshotRequest<KilnRaft>,
    },
    InstallSnapshotResponse(InstallSnapshotResponse<NodeId>),
    /// Who are you, and which cluster do you belong to (a broker starting on an empty disk asks
    /// its peers before it takes part in anything).
    Hello(Hello),
    HelloResponse(HelloAnswer),
    /// A proposal for the named group's leader to make on the sender's behalf (a broker that
    /// is not the controller asking for producer ids); what the bytes mean is the group's.
    Forward(Bytes),
    /// `Ok` with the group's answer (empty for a proposal) once the receiver has done what
    /// was asked, else why not.
    ForwardResponse(Result<Bytes, String>),
    /// The heartbeat of every group `sender` leads and the receiver follows (`pulse.rs`).
    Beat {
        sender: NodeId,
        items: Vec<BeatItem>,
    },
    /// One answer per item of a beat, in its order.
    BeatResponse(Vec<BeatAnswer>),
    /// The request was not served (unknown group, wrong node, Raft stopped, bad frame).
    Error(String),
}

impl Message {
    /// Whether a peer may send this kind as a request (the rest are answers).
    pub fn is_request(&self) -> bool {
        matches!(
            self,
            Message::AppendEntries { .. }
                | Message::Vote { .. }
                | Message::InstallSnapshot { .. }
                | Message::Hello(_)
                | Message::Forward(_)
                | Message::Beat { .. }
        )
    }

    pub fn kind(&self) -> u8 {
        match self {
            Message::AppendEntries { .. } => KIND_APPEND,
            Message::AppendEntriesResponse(_) => KIND_APPEND_RESPONSE,
            Message::Vote { .. } => KIND_VOTE,
            Message::VoteResponse(_) => KIND_VOTE_RESPONSE,
            Message::InstallSnapshot { .. } => KIND_SNAPSHOT,
            Message::InstallSnapshotResponse(_) => KIND_SNAPSHOT_RESPONSE,
            Message::Hello(_) => KIND_HELLO,
            Message::HelloResponse(_) => KIND_HELLO_RESPONSE,
            Message::Forward(_) => KIND_FORWARD,
            Message::ForwardResponse(_) => KIND_FORWARD_RESPONSE,
            Message::Beat { .. } => KIND_BEAT,
            Message::BeatResponse(_) => KIND_BEAT_RESPONSE,
            Message::Error(_) => KIND_ERROR,
        }
    }
}

/// Names a kind byte in errors and logs.
pub struct KindName(pub u8);

impl fmt::Display for KindName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            KIND_APPEND => f.write_str("AppendEntries request"),
            KIND_APPEND_RESPONSE => f.write_str("AppendEntries response"),
            KIND_VOTE => f.write_str("Vote request"),
            KIND_VOTE_RESPONSE => f.write_str("Vote response"),
            KIND_ERROR => f.write_str("Error response"),
            KIND_SNAPSHOT => f.write_str("InstallSnapshot request"),
            KIND_SNAPSHOT_RESPONSE => f.write_str("InstallSnapshot response"),
            KIND_HELLO => f.write_str("Hello request"),
            KIND_HELLO_RESPONSE => f.write_str("Hello response"),
            KIND_FORWARD => f.write_str("Forward request"),
            KIND_FORWARD_RESPONSE => f.write_str("Forward response"),
            KIND_BEAT => f.write_str("Beat request"),
            KIND_BEAT_RESPONSE => f.write_str("Beat response"),
            other => write!(f, "kind {other}"),
        }
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Message::AppendEntries { target, rpc } => {
                write!(f, "AppendEntries(to {target}: {rpc:?})")
            }
            Message::AppendEntriesResponse(r) => write!(f, "AppendEntriesResponse({r:?})"),
            Message::Vote { target, rpc } => write!(f, "Vote(to {target}: {rpc:?})"),
            Message::VoteResponse(r) => write!(f, "VoteResponse({r:?})"),
            Message::InstallSnapshot { target, rpc } => write!(
                f,
                "InstallSnapshot(to {target}: {} at {}, {} bytes, done {})",
                rpc.meta,
                rpc.offset,
                rpc.data.len(),
                rpc.done
            ),
            Message::InstallSnapshotResponse(r) => write!(f, "InstallSnapshotResponse({r:?})"),
            Message::Hello(h) => write!(
                f,
                "Hello(from {} incarnation {:x})",
                h.sender, h.incarnation
            ),
            Message::HelloResponse(a) => {
                write!(
                    f,
                    "HelloResponse(node {}, cluster {:?}, sender registered as {:?})",
                    a.node, a.cluster_id, a.sender_incarnation
                )
            }
            Message::Forward(p) => write!(f, "Forward({} bytes)", p.len()),
            Message::ForwardResponse(r) => write!(f, "ForwardResponse({r:?})"),
            Message::Beat { sender, items } => {
                write!(f, "Beat(from {sender}: {} groups)", items.len())
            }
            Message::BeatResponse(a) => write!(f, "BeatResponse({} answers)", a.len()),
            Message::Error(reason) => write!(f, "Error({reason:?})"),
        }
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_log_id(out: &mut Vec<u8>, log_id: &Option<LogId>) {
    match log_id {
        None => out.push(0),
        Some(id) => {
            out.push(1);
            put_u64(out, id.leader_id.term);
            put_u64(out, id.index);
        }
    }
}

/// Appends an entry's encoding (see the module docs) to `out`.
fn encode_entry(entry: &Entry, out: &mut Vec<u8>) -> Result<(), CodecError> {
    put_u64(out, entry.log_id.leader_id.term);
    put_u64(out, entry.log_id.index);
    match &entry.payload {
        EntryPayload::Blank => out.push(ENTRY_BLANK),
        EntryPayload::Membership(m) => {
            out.push(ENTRY_MEMBERSHIP);
            encode_membership(m, out);
        }
        EntryPayload::Normal(Payload::Records {
            batches,
            record_count,
            kafka_offset,
        }) => {
            out.push(ENTRY_RECORDS);
            out.extend_from_slice(&kafka_offset.unwrap_or(i64::MIN).to_be_bytes());
            out.extend_from_slice(&record_count.to_be_bytes());
            out.extend_from_slice(batches);
        }
        EntryPayload::Normal(Payload::Command(c)) => {
            out.push(ENTRY_COMMAND);
            out.extend_from_slice(&c.encode());
        }
        EntryPayload::Normal(Payload::Summary { .. }) => {
            return Err(malformed("a summary entry is never sent"));
        }
        EntryPayload::Normal(Payload::WrittenAhead { .. }) => {
            return Err(malformed(
                "an entry written ahead is never sent (replication reads the log)",
            ));
        }
    }
    Ok(())
}

fn decode_entry(bytes: &[u8]) -> Result<Entry, CodecError> {
    let mut r = Reader { buf: bytes, at: 0 };
    let term = r.u64("entry term")?;
    let index = r.u64("entry index")?;
    let log_id = LogId::new(CommittedLeaderId::new(term, 0), index);
    let payload = match r.u8("entry kind")? {
        ENTRY_BLANK => EntryPayload::Blank,
        ENTRY_MEMBERSHIP => {
            let mut rr = crate::record::Reader::new(r.rest());
            let m = decode_membership(&mut rr)
                .filter(|_| rr.done())
                .ok_or_else(|| malformed("bad membership entry"))?;
            EntryPayload::Membership(m)
        }
        ENTRY_RECORDS => {
            let kafka = r.u64("kafka offset")? as i64;
            let record_count = r.u32("record count")?;
            let batches = r.rest();
            kiln_log::batch::validate_batches(batches)
                .map_err(|e| malformed(format!("entry {index}: {e}")))?;
            let counted = kiln_log::batch::count_records(batches)
                .map_err(|e| malformed(format!("entry {index}: {e}")))?;
            if counted != record_count {
                return Err(malformed(format!(
                    "entry {index} says {record_count} records, its batches hold {counted}"
                )));
            }
            EntryPayload::Normal(Payload::Records {
                batches: Bytes::copy_from_slice(batches),
                record_count,
                kafka_offset: (kafka != i64::MIN).then_some(kafka),
            })
        }
        ENTRY_COMMAND => EntryPayload::Normal(Payload::Command(
            Command::decode(r.rest()).ok_or_else(|| malformed("bad command entry"))?,
        )),
        other => return Err(malformed(format!("entry kind {other}"))),
    };
    r.finish("entry")?;
    Ok(Entry { log_id, payload })
}

/// Encodes one whole frame, header included, ready to write.
pub fn encode(id: u32, group: &str, message: &Message) -> Result<Vec<u8>, CodecError> {
    let group_len = u16::try_from(group.len())
        .map_err(|_| malformed(format!("group name of {} bytes", group.len())))?;
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&[0; HEADER]);
    out.push(message.kind());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&group_len.to_be_bytes());
    out.extend_from_slice(group.as_bytes());
    match message {
        Message::AppendEntries { target, rpc } => {
            put_u64(&mut out, *target);
            encode_vote_payload(&rpc.vote, &mut out);
            put_log_id(&mut out, &rpc.prev_log_id);
            put_log_id(&mut out, &rpc.leader_commit);
            let count =
                u32::try_from(rpc.entries.len()).map_err(|_| malformed("too many entries"))?;
            out.extend_from_slice(&count.to_be_bytes());
            for entry in &rpc.entries {
                // Length slot first, patched once the entry is written: one buffer, no copy.
                let slot = out.len();
                out.extend_from_slice(&[0; 4]);
                encode_entry(entry, &mut out)?;
                let len = out.len() - slot - 4;
                if len > MAX_FRAME_BYTES {
                    return Err(CodecError::TooLarge {
                        len,
                        max: MAX_FRAME_BYTES,
                    });
                }
                out[slot..slot + 4].copy_from_slice(&(len as u32).to_be_bytes());
            }
        }
        Message::AppendEntriesResponse(resp) => match resp {
            AppendEntriesResponse::Success => out.push(0),
            AppendEntriesResponse::PartialSuccess(matching) => {
                out.push(1);
                put_log_id(&mut out, matching);
            }
            AppendEntriesResponse::Conflict => out.push(2),
            AppendEntriesResponse::HigherVote(vote) => {
                out.push(3);
                encode_vote_payload(vote, &mut out);
            }
        },
        Message::Vote { target, rpc } => {
            put_u64(&mut out, *target);
            encode_vote_payload(&rpc.vote, &mut out);
            put_log_id(&mut out, &rpc.last_log_id);
        }
        Message::VoteResponse(resp) => {
            encode_vote_payload(&resp.vote, &mut out);
            out.push(u8::from(resp.vote_granted));
            put_log_id(&mut out, &resp.last_log_id);
        }
        Message::InstallSnapshot { target, rpc } => {
            put_u64(&mut out, *target);
            encode_vote_payload(&rpc.vote, &mut out);
            put_log_id(&mut out, &rpc.meta.last_log_id);
            put_log_id(&mut out, rpc.meta.last_membership.log_id());
            encode_membership(rpc.meta.last_membership.membership(), &mut out);
            let id = rpc.meta.snapshot_id.as_bytes();
            let id_len = u16::try_from(id.len()).map_err(|_| malformed("snapshot id too long"))?;
            out.extend_from_slice(&id_len.to_be_bytes());
            out.extend_from_slice(id);
            put_u64(&mut out, rpc.offset);
            out.push(u8::from(rpc.done));
            out.extend_from_slice(&rpc.data);
        }
        Message::InstallSnapshotResponse(resp) => encode_vote_payload(&resp.vote, &mut out),
        Message::Hello(hello) => {
            put_u64(&mut out, hello.sender);
            put_u64(&mut out, hello.incarnation);
        }
        Message::HelloResponse(answer) => {
            put_u64(&mut out, answer.node);
            out.push(u8::from(answer.sender_incarnation.is_some()));
            put_u64(&mut out, answer.sender_incarnation.unwrap_or(0));
            out.push(u8::from(answer.cluster_id.is_some()));
            out.extend_from_slice(answer.cluster_id.as_deref().unwrap_or("").as_bytes());
        }
        Message::Forward(payload) => out.extend_from_slice(payload),
        Message::ForwardResponse(result) => {
            out.push(u8::from(result.is_ok()));
            match result {
                Ok(answer) => out.extend_from_slice(answer),
                Err(reason) => out.extend_from_slice(reason_bytes(reason)),
            }
        }
        Message::Beat { sender, items } => {
            if items.len() > BEAT_ITEMS_MAX {
                return Err(malformed(format!(
                    "a beat of {} groups (at most {BEAT_ITEMS_MAX})",
                    items.len()
                )));
            }
            put_u64(&mut out, *sender);
            out.extend_from_slice(&(items.len() as u32).to_be_bytes());
            for item in items {
                let name = item.group.as_bytes();
                if name.len() > BEAT_GROUP_NAME_MAX {
                    return Err(malformed(format!(
                        "group name of {} bytes in a beat (at most {BEAT_GROUP_NAME_MAX})",
                        name.len()
                    )));
                }
                out.extend_from_slice(&(name.len() as u16).to_be_bytes());
                out.extend_from_slice(name);
                put_u64(&mut out, item.term);
                put_log_id(&mut out, &item.applied);
            }
        }
        Message::BeatResponse(answers) => {
            if answers.len() > BEAT_ITEMS_MAX {
                return Err(malformed(format!(
                    "a beat answer of {} groups (at most {BEAT_ITEMS_MAX})",
                    answers.len()
                )));
            }
            out.extend_from_slice(&(answers.len() as u32).to_be_bytes());
            for a in answers {
                let mut flags = 0;
                if a.accepted {
                    flags |= BEAT_ACCEPTED;
                }
                if a.caught_up {
                    flags |= BEAT_CAUGHT_UP;
                }
                out.push(flags);
            }
        }
        Message::Error(reason) => out.extend_from_slice(reason_bytes(reason)),
    }
    let len = out.len() - HEADER;
    let Some(max) = frame_bytes_max(message.kind()) else {
        unreachable!("every message has a known kind, {} too", message.kind());
    };
    if len > max {
        return Err(CodecError::TooLarge { len, max });
    }
    let crc = crc32c::crc32c(&out[HEADER..]);
    out[0..4].copy_from_slice(&(len as u32).to_be_bytes());
    out[4..8].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// A bounds-checked cursor over a frame body.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], CodecError> {
        let end = self
            .at
            .checked_add(n)
            .ok_or_else(|| malformed(format!("{what}: length overflows")))?;
        let out = self
            .buf
            .get(self.at..end)
            .ok_or_else(|| malformed(format!("{what}: body ends early")))?;
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self, what: &str) -> Result<u8, CodecError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, CodecError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, CodecError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, CodecError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn bool(&mut self, what: &str) -> Result<bool, CodecError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(malformed(format!("{what}: {other} is not a boolean"))),
        }
    }
    fn vote(&mut self, what: &str) -> Result<Vote, CodecError> {
        let bytes = self.take(VOTE_BYTES, what)?;
        decode_vote(bytes).ok_or_else(|| malformed(format!("{what}: bad vote")))
    }
    fn log_id(&mut self, what: &str) -> Result<Option<LogId>, CodecError> {
        if !self.bool(what)? {
            return Ok(None);
        }
        let term = self.u64(what)?;
        let index = self.u64(what)?;
        // With one leader per term a committed leader id is the term alone.
        Ok(Some(LogId::new(CommittedLeaderId::new(term, 0), index)))
    }
    fn rest(&mut self) -> &'a [u8] {
        let out = self.buf.get(self.at..).unwrap_or(&[]);
        self.at = self.buf.len();
        out
    }
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.at)
    }
    fn finish(&self, what: &str) -> Result<(), CodecError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(malformed(format!("{what}: {n} unexpected trailing bytes"))),
        }
    }
}

/// Checks a frame header: the body length it announces, and its CRC.
pub fn parse_header(header: &[u8; HEADER]) -> Result<(usize, u32), CodecError> {
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_FRAME_BYTES {
        return Err(CodecError::TooLarge {
            len,
            max: MAX_FRAME_BYTES,
        });
    }
    if len < MIN_BODY {
        return Err(malformed(format!("body of {len} bytes")));
    }
    Ok((len, crc))
}

/// One decoded frame.
#[derive(Debug)]
pub struct Frame {
    /// The request id (a response's is its request's).
    pub id: u32,
    pub group: String,
    pub message: Message,
}

/// Decodes a frame body whose header announced `crc`.
pub fn decode_body(body: &[u8], crc: u32) -> Result<Frame, CodecError> {
    let actual = crc32c::crc32c(body);
    if actual != crc {
        return Err(CodecError::BadCrc {
            expected: crc,
            actual,
        });
    }
    let mut r = Reader { buf: body, at: 0 };
    let kind = r.u8("kind")?;
    let id = r.u32("request id")?;
    let group_len = usize::from(r.u16("group name length")?);
    let group = std::str::from_utf8(r.take(group_len, "group name")?)
        .map_err(|_| malformed("group name is not UTF-8"))?
        .to_string();
    let message = match kind {
        KIND_APPEND => {
            let target = r.u64("target")?;
            let vote = r.vote("vote")?;
            let prev_log_id = r.log_id("prev_log_id")?;
            let leader_commit = r.log_id("leader_commit")?;
            let count = r.u32("entry count")? as usize;
            // Every entry takes at least its 4-byte length, so a count past that is a lie;
            // capacity is bounded by what actually arrived.
            let mut entries = Vec::with_capacity(count.min(r.remaining() / 4));
            for _ in 0..count {
                let len = r.u32("entry length")? as usize;
                let bytes = r.take(len, "entry")?;
                entries.push(decode_entry(bytes)?);
            }
            Message::AppendEntries {
                target,
                rpc: AppendEntriesRequest {
                    vote,
                    prev_log_id,
                    leader_commit,
                    entries,
                },
            }
        }
        KIND_APPEND_RESPONSE => Message::AppendEntriesResponse(match r.u8("response tag")? {
            0 => AppendEntriesResponse::Success,
            1 => AppendEntriesResponse::PartialSuccess(r.log_id("matching")?),
            2 => AppendEntriesResponse::Conflict,
            3 => AppendEntriesResponse::HigherVote(r.vote("higher vote")?),
            other => return Err(malformed(format!("AppendEntries response tag {other}"))),
        }),
        KIND_VOTE => {
            let target = r.u64("target")?;
            let vote = r.vote("vote")?;
            let last_log_id = r.log_id("last_log_id")?;
            Message::Vote {
                target,
                rpc: VoteRequest { vote, last_log_id },
            }
        }
        KIND_VOTE_RESPONSE => {
            let vote = r.vote("vote")?;
            let vote_granted = r.bool("vote_granted")?;
            let last_log_id = r.log_id("last_log_id")?;
            Message::VoteResponse(VoteResponse {
                vote,
                vote_granted,
                last_log_id,
            })
        }
        KIND_SNAPSHOT => {
            let target = r.u64("target")?;
            let vote = r.vote("vote")?;
            let last_log_id = r.log_id("last_log_id")?;
            let membership_id = r.log_id("membership log id")?;
            // The membership decoder reads from a sub-reader; advance ours by what it took.
            let rest = &r.buf[r.at..];
            let mut rr = crate::record::Reader::new(rest);
            let membership =
                decode_membership(&mut rr).ok_or_else(|| malformed("bad snapshot membership"))?;
            r.at += rr.at;
            let id_len = usize::from(r.u16("snapshot id length")?);
            let snapshot_id = std::str::from_utf8(r.take(id_len, "snapshot id")?)
                .map_err(|_| malformed("snapshot id is not UTF-8"))?
                .to_string();
            let offset = r.u64("offset")?;
            let done = r.bool("done")?;
            let data = r.rest().to_vec();
            Message::InstallSnapshot {
                target,
                rpc: InstallSnapshotRequest {
                    vote,
                    meta: SnapshotMeta {
                        last_log_id,
                        last_membership: StoredMembership::new(membership_id, membership),
                        snapshot_id,
                    },
                    offset,
                    data,
                    done,
                },
            }
        }
        KIND_SNAPSHOT_RESPONSE => Message::InstallSnapshotResponse(InstallSnapshotResponse {
            vote: r.vote("vote")?,
        }),
        KIND_HELLO => Message::Hello(Hello {
            sender: r.u64("sender")?,
            incarnation: r.u64("incarnation")?,
        }),
        KIND_HELLO_RESPONSE => {
            let node = r.u64("node")?;
            let registered = r.bool("registered")?;
            let incarnation = r.u64("incarnation")?;
            let has = r.bool("has_cluster")?;
            let id = String::from_utf8(r.rest().to_vec())
                .map_err(|_| malformed("cluster id is not UTF-8"))?;
            Message::HelloResponse(HelloAnswer {
                node,
                sender_incarnation: registered.then_some(incarnation),
                cluster_id: has.then_some(id),
            })
        }
        KIND_FORWARD => Message::Forward(Bytes::copy_from_slice(r.rest())),
        KIND_FORWARD_RESPONSE => {
            let ok = r.bool("ok")?;
            let rest = r.rest();
            Message::ForwardResponse(if ok {
                Ok(Bytes::copy_from_slice(rest))
            } else {
                Err(String::from_utf8(rest.to_vec())
                    .map_err(|_| malformed("forward reason is not UTF-8"))?)
            })
        }
        KIND_BEAT => {
            let sender = r.u64("sender")?;
            let count = beat_count(r.u32("beat count")?)?;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                let len = usize::from(r.u16("beat group name length")?);
                if len > BEAT_GROUP_NAME_MAX {
                    return Err(malformed(format!(
                        "beat group name of {len} bytes (at most {BEAT_GROUP_NAME_MAX})"
                    )));
                }
                let name = std::str::from_utf8(r.take(len, "beat group name")?)
                    .map_err(|_| malformed("beat group name is not UTF-8"))?;
                items.push(BeatItem {
                    group: std::sync::Arc::from(name),
                    term: r.u64("beat term")?,
                    applied: r.log_id("beat applied log id")?,
                });
            }
            Message::Beat { sender, items }
        }
        KIND_BEAT_RESPONSE => {
            let count = beat_count(r.u32("beat answer count")?)?;
            let mut answers = Vec::with_capacity(count);
            for _ in 0..count {
                let flags = r.u8("beat answer")?;
                if flags & !(BEAT_ACCEPTED | BEAT_CAUGHT_UP) != 0 {
                    return Err(malformed(format!("beat answer flags {flags:#04x}")));
                }
                answers.push(BeatAnswer {
                    accepted: flags & BEAT_ACCEPTED != 0,
                    caught_up: flags & BEAT_CAUGHT_UP != 0,
                });
            }
            Message::BeatResponse(answers)
        }
        KIND_ERROR => Message::Error(
            String::from_utf8(r.rest().to_vec())
                .map_err(|_| malformed("error reason is not UTF-8"))?,
        ),
        other => return Err(malformed(format!("unknown message kind {other}"))),
    };
    r.finish(&KindName(kind).to_string())?;
    Ok(Frame { id, group, message })
}

/// A beat's item count, checked against [`BEAT_ITEMS_MAX`] before anything is reserved.
fn beat_count(count: u32) -> Result<usize, CodecError> {
    usize::try_from(count)
        .ok()
        .filter(|&n| n <= BEAT_ITEMS_MAX)
        .ok_or_else(|| {
            malformed(format!(
                "a beat of {count} groups (at most {BEAT_ITEMS_MAX})"
            ))
        })
}

/// Reads one frame. `Ok(None)` when the stream ends cleanly between frames.
pub async fn read_frame<R>(r: &mut R) -> Result<Option<Frame>, CodecError>
where
    R: AsyncRead + Unpin,
{
    let mut header = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        match r.read(&mut header[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => return Err(CodecError::Truncated),
            n => got += n,
        }
    }
    let (len, crc) = parse_header(&header)?;
    // The kind first: its limit applies before the rest is read.
    let kind = match r.read_u8().await {
        Ok(kind) => kind,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(CodecError::Truncated),
        Err(e) => return Err(e.into()),
    };
    let Some(max) = frame_bytes_max(kind) else {
        return Err(malformed(format!("unknown kind {kind}")));
    };
    if len > max {
        return Err(CodecError::TooLarge { len, max });
    }
    // The buffer grows with what actually arrives rather than with what the header claims,
    // so a lying length costs at most what the peer really sends.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    body.push(kind);
    (&mut *r)
        .take(len as u64 - 1)
        .read_to_end(&mut body)
        .await?;
    if body.len() < len {
        return Err(CodecError::Truncated);
    }
    decode_body(&body, crc).map(Some)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeSet;

    use bytes::Bytes;
    use openraft::{EntryPayload, Membership};

    use super::*;
    use crate::payload::Payload;
    use crate::sim::build_batch;
    use crate::types::Entry;

    fn lid(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 0), index)
    }

    /// The request id every test frame carries: four distinct bytes, so a misplaced field
    /// would not decode back to it.
    const ID: u32 = 0x0102_0304;

    fn decode_all(frame: &[u8]) -> (String, Message) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut input = frame;
        let out = rt.block_on(read_frame(&mut input)).unwrap().unwrap();
        assert!(input.is_empty(), "the whole frame is consumed");
        assert_eq!(out.id, ID);
        (out.group, out.message)
    }

    fn read_err(bytes: &[u8]) -> CodecError {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut input = bytes;
        match rt.block_on(read_frame(&mut input)) {
            Err(e) => e,
            Ok(m) => panic!("expected an error, got {m:?}"),
        }
    }

    fn entries() -> Vec<Entry> {
        let batch = build_batch(&[b"one".to_vec(), b"two".to_vec()], 1_700_000_000_000);
        let mut two = build_batch(&[b"three".to_vec()], 1_700_000_000_001);
        two.extend_from_slice(&build_batch(&[vec![7u8; 3000]], 1_700_000_000_002));
        vec![
            Entry {
                log_id: lid(0, 1),
                payload: EntryPayload::Membership(Membership::new(
                    vec![BTreeSet::from([1, 2, 3])],
                    BTreeSet::from([1, 2, 3]),
                )),
            },
            Entry {
                log_id: lid(4, 2),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: lid(4, 3),
                payload: EntryPayload::Normal(Payload::Records {
                    batches: Bytes::from(batch),
                    record_count: 2,
                    kafka_offset: None,
                }),
            },
            Entry {
                log_id: lid(4, 4),
                payload: EntryPayload::Normal(Payload::Records {
                    batches: Bytes::from(two),
                    record_count: 2,
                    kafka_offset: Some(2),
                }),
            },
        ]
    }

    fn votes() -> Vec<Vote> {
        vec![
            Vote::new(0, 0),
            Vote::new(7, 3),
            Vote::new_committed(u64::MAX, u64::MAX),
            Vote {
                leader_id: openraft::LeaderId {
                    term: 9,
                    voted_for: None,
                },
                committed: false,
            },
        ]
    }

    fn log_ids() -> Vec<Option<LogId>> {
        vec![
            None,
            Some(lid(0, 0)),
            Some(lid(3, 17)),
            Some(lid(u64::MAX, u64::MAX)),
        ]
    }

    fn assert_same_entries(a: &[Entry], b: &[Entry]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.log_id, y.log_id);
            assert_eq!(format!("{:?}", x.payload), format!("{:?}", y.payload));
        }
    }

    #[test]
    fn append_entries_requests_round_trip() {
        for vote in votes() {
            for prev in log_ids() {
                for (commit, entries) in [(None, vec![]), (Some(lid(4, 3)), entries())] {
                    let msg = Message::AppendEntries {
                        target: 2,
                        rpc: AppendEntriesRequest {
                            vote,
                            prev_log_id: prev,
                            leader_commit: commit,
                            entries: entries.clone(),
                        },
                    };
                    let frame = encode(ID, "orders/3", &msg).unwrap();
                    let (group, back) = decode_all(&frame);
                    assert_eq!(group, "orders/3");
                    let Message::AppendEntries { target, rpc } = back else {
                        panic!("wrong kind: {back:?}");
                    };
                    assert_eq!(target, 2);
                    assert_eq!(rpc.vote, vote);
                    assert_eq!(rpc.prev_log_id, prev);
                    assert_eq!(rpc.leader_commit, commit);
                    assert_same_entries(&rpc.entries, &entries);
                }
            }
        }
    }

    #[test]
    fn responses_and_vote_requests_round_trip() {
        let mut append_responses = vec![
            AppendEntriesResponse::Success,
            AppendEntriesResponse::Conflict,
        ];
        for id in log_ids() {
            append_responses.push(AppendEntriesResponse::PartialSuccess(id));
        }
        for vote in votes() {
            append_responses.push(AppendEntriesResponse::HigherVote(vote));
        }
        for resp in append_responses {
            // AppendEntriesResponse is not Clone: encode a rebuilt copy.
            let copy = match &resp {
                AppendEntriesResponse::Success => AppendEntriesResponse::Success,
                AppendEntriesResponse::PartialSuccess(m) => {
                    AppendEntriesResponse::PartialSuccess(*m)
                }
                AppendEntriesResponse::Conflict => AppendEntriesResponse::Conflict,
                AppendEntriesResponse::HigherVote(v) => AppendEntriesResponse::HigherVote(*v),
            };
            let frame = encode(
                ID,
                "__cluster_metadata/0",
                &Message::AppendEntriesResponse(copy),
            )
            .unwrap();
            let (group, back) = decode_all(&frame);
            assert_eq!(group, "__cluster_metadata/0");
            assert!(matches!(back, Message::AppendEntriesResponse(r) if r == resp));
        }
        for vote in votes() {
            for last in log_ids() {
                let rpc = VoteRequest::new(vote, last);
                let frame = encode(
                    ID,
                    "g",
                    &Message::Vote {
                        target: 3,
                        rpc: rpc.clone(),
                    },
                )
                .unwrap();
                let (_, back) = decode_all(&frame);
                assert!(matches!(back, Message::Vote { target: 3, rpc: r } if r == rpc));
                for granted in [false, true] {
                    let resp = VoteResponse {
                        vote,
                        vote_granted: granted,
                        last_log_id: last,
                    };
                    let frame = encode(ID, "g", &Message::VoteResponse(resp.clone())).unwrap();
                    let (_, back) = decode_all(&frame);
                    assert!(matches!(back, Message::VoteResponse(r) if r == resp));
                }
            }
        }
        for reason in ["", "unknown group \"orders/3\"", "raft: raft stopped ✓"] {
            let frame = encode(ID, "", &Message::Error(reason.to_string())).unwrap();
            let (group, back) = decode_all(&frame);
            assert_eq!(group, "");
            assert!(matches!(back, Message::Error(r) if r == reason));
        }
        let answers: [Result<Bytes, String>; 4] = [
            Ok(Bytes::new()),
            Ok(Bytes::from_static(b"[{\"i\":0}]")),
            Err(String::new()),
            Err("not the controller ✓".to_string()),
        ];
        for answer in answers {
            let frame = encode(
                ID,
                "__topic_changes",
                &Message::ForwardResponse(answer.clone()),
            )
            .unwrap();
            let (group, back) = decode_all(&frame);
            assert_eq!(group, "__topic_changes");
            assert!(matches!(back, Message::ForwardResponse(r) if r == answer));
        }
    }

    fn sample_frame() -> Vec<u8> {
        encode(
            ID,
            "orders/3",
            &Message::AppendEntries {
                target: 1,
                rpc: AppendEntriesRequest {
                    vote: Vote::new_committed(4, 1),
                    prev_log_id: Some(lid(4, 1)),
                    leader_commit: Some(lid(4, 1)),
                    entries: entries(),
                },
            },
        )
        .unwrap()
    }

    #[test]
    fn a_corrupt_body_fails_its_crc() {
        let frame = sample_frame();
        for at in [HEADER + 1, HEADER + 20, frame.len() - 1] {
            let mut bad = frame.clone();
            bad[at] ^= 0x40;
            assert!(
                matches!(read_err(&bad), CodecError::BadCrc { .. }),
                "flip at {at}"
            );
        }
        // The kind byte is read (and its size limit applied) before the CRC can be checked:
        // a flipped kind is refused as unknown, or else by the CRC.
        let mut bad = frame.clone();
        bad[HEADER] ^= 0x40;
        assert!(matches!(read_err(&bad), CodecError::Malformed(m) if m.contains("unknown kind")));
        let mut bad = frame.clone();
        bad[5] ^= 1;
        let e = read_err(&bad);
        assert!(matches!(e, CodecError::BadCrc { .. }));
        assert!(e.to_string().contains("checksum"), "{e}");
    }

    #[test]
    fn oversized_and_undersized_lengths_are_refused_before_reading_the_body() {
        let mut header = Vec::new();
        header.extend_from_slice(&((MAX_FRAME_BYTES + 1) as u32).to_be_bytes());
        header.extend_from_slice(&0u32.to_be_bytes());
        let e = read_err(&header);
        assert!(matches!(e, CodecError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("limit"), "{e}");
        let mut header = vec![0u8, 0, 0, 2];
        header.extend_from_slice(&0u32.to_be_bytes());
        assert!(matches!(read_err(&header), CodecError::Malformed(_)));
    }

    /// A vote claiming 2 MiB is refused on its kind byte, before anything more is read; so is
    /// a kind this protocol lacks. A long reason is cut to fit instead of being refused.
    #[test]
    fn each_kind_has_its_own_size_limit_checked_before_the_body() {
        let mut frame = Vec::new();
        frame.extend_from_slice(&(2u32 << 20).to_be_bytes());
        frame.extend_from_slice(&0u32.to_be_bytes());
        frame.push(KIND_VOTE);
        let e = read_err(&frame);
        assert!(
            matches!(e, CodecError::TooLarge { max, .. } if max == CONTROL_FRAME_BYTES),
            "{e}"
        );
        let mut frame = Vec::new();
        frame.extend_from_slice(&(2u32 << 20).to_be_bytes());
        frame.extend_from_slice(&0u32.to_be_bytes());
        frame.push(KIND_APPEND);
        // The append's limit is the large one: what fails is the missing body.
        assert!(matches!(read_err(&frame), CodecError::Truncated));
        let mut frame = Vec::new();
        frame.extend_from_slice(&16u32.to_be_bytes());
        frame.extend_from_slice(&0u32.to_be_bytes());
        frame.push(200);
        let e = read_err(&frame);
        assert!(e.to_string().contains("unknown kind 200"), "{e}");

        let long = "é".repeat(CONTROL_FRAME_BYTES);
        let encoded = encode(ID, "orders/0", &Message::Error(long)).unwrap();
        let (_, Message::Error(reason)) = decode_all(&encoded) else {
            panic!("an error decodes as an error");
        };
        assert!(reason.len() <= REASON_BYTES_MAX && reason.starts_with('é'));
    }

    #[test]
    fn every_truncation_is_an_error_and_an_empty_stream_is_the_end() {
        let frame = sample_frame();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut empty: &[u8] = &[];
        assert!(rt.block_on(read_frame(&mut empty)).unwrap().is_none());
        for cut in 1..frame.len() {
            let mut input = &frame[..cut];
            let e = rt.block_on(read_frame(&mut input)).err();
            assert!(
                matches!(e, Some(CodecError::Truncated)),
                "cut at {cut}: {e:?}"
            );
        }
    }

    /// A body with a valid CRC but a payload cut short, padded, or with a bad tag: the payload
    /// decoder refuses it rather than reading past the end or ignoring the rest.
    #[test]
    fn malformed_payloads_with_valid_crcs_are_refused() {
        let frame = sample_frame();
        let body = &frame[HEADER..];
        for cut in 0..body.len() {
            let part = &body[..cut];
            assert!(
                decode_body(part, crc32c::crc32c(part)).is_err(),
                "cut at {cut}"
            );
        }
        let mut padded = body.to_vec();
        padded.push(0);
        let e = decode_body(&padded, crc32c::crc32c(&padded)).err();
        assert!(matches!(e, Some(CodecError::Malformed(_))), "{e:?}");
        for kind in [0u8, 6, 255] {
            let mut other = body.to_vec();
            other[0] = kind;
            assert!(decode_body(&other, crc32c::crc32c(&other)).is_err());
        }
        // An entry count far beyond the body does not allocate for it, and fails.
        let msg = Message::AppendEntries {
            target: 1,
            rpc: AppendEntriesRequest {
                vote: Vote::new(1, 1),
                prev_log_id: None,
                leader_commit: None,
                entries: vec![],
            },
        };
        let frame = encode(ID, "g", &msg).unwrap();
        let mut body = frame[HEADER..].to_vec();
        let n = body.len();
        body[n - 4..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_body(&body, crc32c::crc32c(&body)).is_err());
        // A vote response whose granted flag is neither 0 nor 1.
        let frame = encode(
            ID,
            "g",
            &Message::VoteResponse(VoteResponse {
                vote: Vote::new(1, 1),
                vote_granted: true,
                last_log_id: None,
            }),
        )
        .unwrap();
        let mut body = frame[HEADER..].to_vec();
        // Kind, request id, group-name length, "g", then the vote.
        let at = 1 + 4 + 2 + 1 + VOTE_BYTES;
        body[at] = 2;
        assert!(decode_body(&body, crc32c::crc32c(&body)).is_err());
    }

    #[test]
    fn beats_round_trip_and_their_bounds_are_checked() {
        let items = vec![
            BeatItem {
                group: "orders/3".into(),
                term: 7,
                applied: Some(lid(7, 42)),
            },
            BeatItem {
                group: "__consumer_offsets/0".into(),
                term: u64::MAX,
                applied: None,
            },
        ];
        let frame = encode(
            ID,
            "",
            &Message::Beat {
                sender: 3,
                items: items.clone(),
            },
        )
        .unwrap();
        let (group, back) = decode_all(&frame);
        assert_eq!(group, "");
        assert!(matches!(back, Message::Beat { sender: 3, items: i } if i == items));
        let answers = vec![
            BeatAnswer::default(),
            BeatAnswer {
                accepted: true,
                caught_up: false,
            },
            BeatAnswer {
                accepted: true,
                caught_up: true,
            },
        ];
        let frame = encode(ID, "", &Message::BeatResponse(answers.clone())).unwrap();
        let (_, back) = decode_all(&frame);
        assert!(matches!(back, Message::BeatResponse(a) if a == answers));

        // More items than a beat may carry: refused before anything is reserved.
        let mut body = vec![KIND_BEAT, 0, 0, 0, 9, 0, 0];
        body.extend_from_slice(&3u64.to_be_bytes());
        body.extend_from_slice(&u32::MAX.to_be_bytes());
        let e = decode_body(&body, crc32c::crc32c(&body)).unwrap_err();
        assert!(e.to_string().contains("at most 2048"), "{e}");
        // An answer with a flag this protocol lacks.
        let mut body = vec![KIND_BEAT_RESPONSE, 0, 0, 0, 9, 0, 0];
        body.extend_from_slice(&1u32.to_be_bytes());
        body.push(0x04);
        let e = decode_body(&body, crc32c::crc32c(&body)).unwrap_err();
        assert!(e.to_string().contains("flags"), "{e}");
        // A group name past the bound is neither sent nor taken.
        let long = Message::Beat {
            sender: 1,
            items: vec![BeatItem {
                group: "x".repeat(BEAT_GROUP_NAME_MAX + 1).into(),
                term: 1,
                applied: None,
            }],
        };
        assert!(encode(ID, "", &long).is_err());
        let too_many = Message::Beat {
            sender: 1,
            items: vec![items[1].clone(); BEAT_ITEMS_MAX + 1],
        };
        assert!(encode(ID, "", &too_many).is_err());
    }

    #[test]
    fn a_group_name_too_long_for_its_length_field_is_refused() {
        let name = "x".repeat(usize::from(u16::MAX) + 1);
        assert!(encode(ID, &name, &Message::Error(String::new())).is_err());
    }
}
