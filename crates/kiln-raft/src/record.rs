//! Small binary encodings kiln-raft keeps on disk and sends to peers: the `vote` file's state
//! records, votes, memberships and the payloads of command entries. One encoding of each, so
//! the disk and the wire cannot drift apart.
//!
//! `vote`: state records, each framed `[len u32 BE][crc32c u32 BE][payload]`. A state record is
//! `tag u8 (= 1), copy u8, vote (term u64, has_node u8, node u64, committed u8)`, then the
//! repair guard's `repair_until`, `repair_term` and `vote_floor`, each `flag u8, u64`. Every save
//! writes it twice (copy 0, then copy 1, in one write and one fsync), so one damaged frame never
//! loses the latest state. A bare 18-byte vote is the older format (read, never written).
//!
//! A membership is `configs u32, per config: n u32, n × u64, nodes u32, n × u64`.

use std::collections::BTreeSet;

use openraft::Membership;

use crate::guard::Guard;
use crate::types::{NodeId, Vote};

pub(crate) const FRAME_HEADER: usize = 8;

/// Voters per configuration and nodes per membership a decoder accepts: far above any real
/// cluster, and a bound on what a damaged or hostile record can make it allocate.
const MEMBERS_MAX: usize = 1024;
/// Configurations in one membership (openraft's joint consensus uses at most two).
const CONFIGS_MAX: usize = 16;

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

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, at: 0 }
    }
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(out)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(*self.take(1)?.first()?)
    }
    pub(crate) fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let out = self.buf.get(self.at..).unwrap_or(&[]);
        self.at = self.buf.len();
        out
    }
    pub(crate) fn done(&self) -> bool {
        self.at == self.buf.len()
    }
}

pub(crate) fn encode_membership(m: &Membership<NodeId, openraft::EmptyNode>, p: &mut Vec<u8>) {
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

pub(crate) fn decode_membership(
    r: &mut Reader<'_>,
) -> Option<Membership<NodeId, openraft::EmptyNode>> {
    let n = r.u32()? as usize;
    if n > CONFIGS_MAX {
        return None;
    }
    let mut configs = Vec::with_capacity(n);
    for _ in 0..n {
        let k = r.u32()? as usize;
        if k > MEMBERS_MAX {
            return None;
        }
        let mut set = BTreeSet::new();
        for _ in 0..k {
            set.insert(r.u64()?);
        }
        configs.push(set);
    }
    let k = r.u32()? as usize;
    if k > MEMBERS_MAX {
        return None;
    }
    let mut nodes = BTreeSet::new();
    for _ in 0..k {
        nodes.insert(r.u64()?);
    }
    // openraft requires every voter to be a node.
    if configs.iter().flatten().any(|v| !nodes.contains(v)) {
        return None;
    }
    Some(Membership::new(configs, nodes))
}

/// Length of an encoded vote (`term u64, has_node u8, node u64, committed u8`).
pub(crate) const VOTE_BYTES: usize = 18;

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
    let mut r = Reader::new(payload);
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
    let mut r = Reader::new(payload);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn memberships_round_trip_and_bad_ones_are_refused() {
        let m = Membership::new(
            vec![BTreeSet::from([1, 2, 3])],
            BTreeSet::from([1, 2, 3, 4]),
        );
        let mut p = Vec::new();
        encode_membership(&m, &mut p);
        let back = decode_membership(&mut Reader::new(&p)).unwrap();
        assert_eq!(format!("{back:?}"), format!("{m:?}"));
        for cut in 0..p.len() {
            let mut r = Reader::new(&p[..cut]);
            assert!(decode_membership(&mut r).is_none() || !r.done() || cut == p.len());
        }
        // A voter that is not a node, and absurd counts.
        let mut bad = Vec::new();
        bad.extend_from_slice(&1u32.to_be_bytes());
        bad.extend_from_slice(&1u32.to_be_bytes());
        bad.extend_from_slice(&9u64.to_be_bytes());
        bad.extend_from_slice(&0u32.to_be_bytes());
        assert!(decode_membership(&mut Reader::new(&bad)).is_none());
        assert!(decode_membership(&mut Reader::new(&u32::MAX.to_be_bytes())).is_none());
    }
}
