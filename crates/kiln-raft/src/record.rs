//! The record formats of the two files a replica keeps (see docs/replication.md, "Log layout").
//!
//! `raft.log`: one frame per entry, `[len u32 BE][crc32c u32 BE][payload; len bytes]`, payload
//! `term u64, 0 u64, index u64, kind u8`, then for kind 1 (data) the batches, for kind 2
//! (membership) `configs u32, per config: n u32, n × u64, nodes u32, n × u64`; kind 0 (blank)
//! has nothing more.
//!
//! `vote`: state records in the same framing. A state record is `tag u8 (= 1), copy u8, vote
//! (term u64, has_node u8, node u64, committed u8)`, then the repair guard's `repair_until`,
//! `repair_term` and `vote_floor`, each `flag u8, u64`. Every save writes it twice (copy 0,
//! then copy 1, in one write and one fsync), so one damaged frame never loses the latest state.
//! A bare 18-byte vote is the older format (read, never written).

use std::collections::BTreeSet;

use bytes::Bytes;
use openraft::{CommittedLeaderId, EntryPayload, Membership};

use crate::guard::Guard;
use crate::types::{Batches, Entry, LogId, NodeId, Vote};

pub(crate) const FRAME_HEADER: usize = 8;
const KIND_BLANK: u8 = 0;
const KIND_DATA: u8 = 1;
const KIND_MEMBERSHIP: u8 = 2;
/// Largest record accepted at recovery (a length field past it is a torn or corrupt header).
pub(crate) const MAX_RECORD_BYTES: usize = 64 << 20;

pub(crate) fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) at: usize,
}

impl Reader<'_> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&[u8]> {
        let out = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(out)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(*self.take(1)?.first()?)
    }
    pub(crate) fn rest(&mut self) -> &[u8] {
        let out = self.buf.get(self.at..).unwrap_or(&[]);
        self.at = self.buf.len();
        out
    }
}

/// Counts the records in already-validated batches.
pub fn record_count(batches: &[u8]) -> Result<u32, kiln_log::LogError> {
    let mut n: u32 = 0;
    for batch in kiln_log::batch::batches(batches) {
        let records = u32::try_from(batch?.header.record_count).unwrap_or(0);
        n = n.saturating_add(records);
    }
    Ok(n)
}

pub(crate) fn encode_entry(entry: &Entry) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    encode_entry_payload(entry, &mut p);
    frame(&p)
}

/// Appends an entry's payload (a `raft.log` record without its framing) to `p`. The network
/// transport sends entries in this encoding too, so there is one entry format to keep right.
pub(crate) fn encode_entry_payload(entry: &Entry, p: &mut Vec<u8>) {
    p.extend_from_slice(&entry.log_id.leader_id.term.to_be_bytes());
    // With one leader per term the log id names the term only; the field is kept for a
    // format that also fits openraft's default (several leaders per term) mode.
    p.extend_from_slice(&0u64.to_be_bytes());
    p.extend_from_slice(&entry.log_id.index.to_be_bytes());
    match &entry.payload {
        EntryPayload::Blank => p.push(KIND_BLANK),
        EntryPayload::Normal(Batches(bytes)) => {
            p.push(KIND_DATA);
            p.extend_from_slice(bytes);
        }
        EntryPayload::Membership(m) => {
            p.push(KIND_MEMBERSHIP);
            let configs = m.get_joint_config();
            p.extend_from_slice(&(configs.len() as u32).to_be_bytes());
            for config in configs {
                p.extend_from_slice(&(config.len() as u32).to_be_bytes());
                for id in config {
                    p.extend_from_slice(&id.to_be_bytes());
                }
            }
            let nodes: Vec<NodeId> = m.nodes().map(|(id, _)| *id).collect();
            p.extend_from_slice(&(nodes.len() as u32).to_be_bytes());
            for id in nodes {
                p.extend_from_slice(&id.to_be_bytes());
            }
        }
    }
}

pub(crate) fn decode_entry(payload: &[u8]) -> Option<Entry> {
    let mut r = Reader {
        buf: payload,
        at: 0,
    };
    let term = r.u64()?;
    let node = r.u64()?;
    let index = r.u64()?;
    let log_id = LogId::new(CommittedLeaderId::new(term, node), index);
    let payload = match r.u8()? {
        KIND_BLANK => EntryPayload::Blank,
        KIND_DATA => EntryPayload::Normal(Batches(Bytes::copy_from_slice(r.rest()))),
        KIND_MEMBERSHIP => {
            let n = r.u32()? as usize;
            let mut configs = Vec::new();
            for _ in 0..n.min(16) {
                let k = r.u32()? as usize;
                let mut set = BTreeSet::new();
                for _ in 0..k.min(1024) {
                    set.insert(r.u64()?);
                }
                configs.push(set);
            }
            let k = r.u32()? as usize;
            let mut nodes = BTreeSet::new();
            for _ in 0..k.min(1024) {
                nodes.insert(r.u64()?);
            }
            EntryPayload::Membership(Membership::new(configs, nodes))
        }
        _ => return None,
    };
    Some(Entry { log_id, payload })
}

pub(crate) fn entry_records(entry: &Entry) -> u32 {
    match &entry.payload {
        EntryPayload::Normal(Batches(bytes)) => record_count(bytes).unwrap_or(0),
        _ => 0,
    }
}

/// Length of an encoded vote (`term u64, has_node u8, node u64, committed u8`).
pub(crate) const VOTE_BYTES: usize = 18;

/// Appends a vote's payload (a `vote` record without its framing) to `p`; the network
/// transport uses the same encoding.
pub(crate) fn encode_vote_payload(vote: &Vote, p: &mut Vec<u8>) {
    p.extend_from_slice(&vote.leader_id.term.to_be_bytes());
    match vote.leader_id.voted_for {
        Some(node) => {
            p.push(1);
            p.extend_from_slice(&node.to_be_bytes());
        }
        None => {
            p.push(0);
            p.extend_from_slice(&0u64.to_be_bytes());
        }
    }
    p.push(u8::from(vote.committed));
}

pub(crate) fn decode_vote(payload: &[u8]) -> Option<Vote> {
    let mut r = Reader {
        buf: payload,
        at: 0,
    };
    let term = r.u64()?;
    let has_node = r.u8()? != 0;
    let node = r.u64()?;
    let committed = r.u8()? != 0;
    Some(Vote {
        leader_id: openraft::LeaderId {
            term,
            voted_for: has_node.then_some(node),
        },
        committed,
    })
}

/// Smallest entry payload (a blank entry): the scanner's bound on how far indexes can advance
/// in a given number of bytes.
pub(crate) const MIN_ENTRY_PAYLOAD: usize = 25;

/// Payload length of a state record in `vote`.
pub(crate) const STATE_BYTES: usize = 2 + VOTE_BYTES + 3 * 9;
const STATE_TAG: u8 = 1;

/// What one `vote` record says: the vote and the repair guard, as of one save.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct VoteState {
    pub(crate) vote: Option<Vote>,
    pub(crate) guard: Guard,
}

/// One decoded `vote` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StateRecord {
    pub(crate) state: VoteState,
    /// 0 or 1 for the two copies of a save; `None` for the older single-copy format.
    pub(crate) copy: Option<u8>,
}

fn put_option(p: &mut Vec<u8>, v: Option<u64>) {
    p.push(u8::from(v.is_some()));
    p.extend_from_slice(&v.unwrap_or(0).to_be_bytes());
}

/// Both framed copies of a save of `state`, ready to append in one write.
pub(crate) fn encode_state_pair(state: &VoteState) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 * (FRAME_HEADER + STATE_BYTES));
    for copy in 0..2u8 {
        let mut p = Vec::with_capacity(STATE_BYTES);
        p.push(STATE_TAG);
        p.push(copy);
        // A state with no vote yet is saved as the initial vote (term 0, nobody), which
        // openraft treats the same as none.
        let vote = state.vote.unwrap_or_default();
        encode_vote_payload(&vote, &mut p);
        put_option(&mut p, state.guard.repair_until);
        put_option(&mut p, state.guard.repair_term);
        put_option(&mut p, state.guard.vote_floor);
        out.extend_from_slice(&frame(&p));
    }
    out
}

pub(crate) fn decode_state(payload: &[u8]) -> Option<StateRecord> {
    if payload.len() == VOTE_BYTES {
        return Some(StateRecord {
            state: VoteState {
                vote: Some(decode_vote(payload)?),
                guard: Guard::default(),
            },
            copy: None,
        });
    }
    if payload.len() != STATE_BYTES {
        return None;
    }
    let mut r = Reader {
        buf: payload,
        at: 0,
    };
    if r.u8()? != STATE_TAG {
        return None;
    }
    let copy = r.u8()?;
    if copy > 1 {
        return None;
    }
    let vote = decode_vote(r.take(VOTE_BYTES)?)?;
    let mut option = || -> Option<Option<u64>> {
        let set = r.u8()?;
        let v = r.u64()?;
        match set {
            0 => Some(None),
            1 => Some(Some(v)),
            _ => None,
        }
    };
    let repair_until = option()?;
    let repair_term = option()?;
    let vote_floor = option()?;
    Some(StateRecord {
        state: VoteState {
            vote: Some(vote),
            guard: Guard {
                repair_until,
                repair_term,
                vote_floor,
            },
        },
        copy: Some(copy),
    })
}
