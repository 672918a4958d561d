//! Bit rot: damage to the synced bytes of a replica that is down, and the aimed scenario in
//! which a replica without the repair guard would lose an acknowledged record.
//!
//! Only damage recovery can tell from a crash is injected: a flipped byte anywhere, a run of
//! bytes missing before the last frame, a garbage length field, and damage to the `vote`
//! file. Damage that only shortens the final frame (or cuts the file's end) reads exactly
//! like a write a crash tore, and is not detected (docs/replication.md, "Damage and full
//! disks").

use rand::rngs::StdRng;
use rand::Rng;

use crate::disk::SimDisk;
use crate::recovery::{scan_log, LogTail};
use crate::types::NodeId;

/// The kinds of damage, in the order of their trace names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RotKind {
    /// One byte XORed with a random non-zero value.
    Flip,
    /// A run of 1-64 bytes gone from before the last frame; what follows moves up.
    Hole,
    /// A frame's length field overwritten with a random value.
    Length,
    /// One byte of the `vote` file flipped (a single damaged copy loses nothing).
    Vote,
    /// One byte flipped in each copy of the latest `vote` save: the vote is lost.
    VoteBoth,
}

/// What a rot did.
pub(super) struct Rotted {
    pub(super) kind: RotKind,
    /// Byte position of the damage.
    pub(super) at: usize,
    /// For the log: the first index recovery will not keep.
    pub(super) first_lost: Option<u64>,
    pub(super) detail: String,
}

/// The aimed scenario, while it waits for an acknowledgement: the leader's link to `lagging`
/// is cut, so the next entry it commits is on the leader and `victim` only.
#[derive(Clone, Copy)]
pub(super) struct RotHunt {
    pub(super) leader: NodeId,
    pub(super) victim: NodeId,
    pub(super) lagging: NodeId,
    pub(super) acks_before: usize,
    pub(super) until: u64,
}

/// Frame start positions in `bytes` (whole frames only).
fn frame_starts(bytes: &[u8]) -> Vec<(usize, u64)> {
    scan_log(bytes)
        .entries
        .iter()
        .map(|(pos, e)| (*pos as usize, e.log_id.index))
        .collect()
}

fn first_lost(bytes: &[u8]) -> Option<u64> {
    match scan_log(bytes).tail {
        LogTail::Damaged(d) => Some(d.first_lost_index),
        _ => None,
    }
}

/// Damages the first `synced` bytes of `log` (or `vote`, of which `vote_synced` are synced),
/// picking the kind at random. `None` if there was nothing synced to damage.
pub(super) fn rot_at_random(
    rng: &mut StdRng,
    log: &SimDisk,
    vote: &SimDisk,
    synced: usize,
    vote_synced: usize,
) -> Option<Rotted> {
    let roll = rng.random_range(0..100);
    if roll >= 80 {
        return rot_vote(rng, vote, vote_synced, roll >= 90);
    }
    let bytes = log.synced_bytes();
    let synced = synced.min(bytes.len());
    let frames = frame_starts(&bytes[..synced]);
    if frames.len() < 2 {
        return None;
    }
    let mut bad = bytes.clone();
    let (kind, at, detail) = match roll {
        0..=49 => {
            let at = rng.random_range(0..synced);
            let mask: u8 = rng.random_range(1..=255);
            bad[at] ^= mask;
            (RotKind::Flip, at, format!("byte {at} ^= {mask:#04x}"))
        }
        50..=69 => {
            let last_start = frames.last().map_or(0, |f| f.0);
            let at = rng.random_range(0..last_start);
            let len = rng.random_range(1..=64).min(last_start - at);
            bad.drain(at..at + len);
            (RotKind::Hole, at, format!("{len} bytes gone at {at}"))
        }
        _ => {
            let (at, index) = frames[rng.random_range(0..frames.len())];
            let len: u32 = rng.random();
            bad[at..at + 4].copy_from_slice(&len.to_be_bytes());
            (
                RotKind::Length,
                at,
                format!("length field of entry {index} at {at} := {len}"),
            )
        }
    };
    let lost = first_lost(&bad);
    log.rot(|b| *b = bad);
    Some(Rotted {
        kind,
        at,
        first_lost: lost,
        detail,
    })
}

fn rot_vote(rng: &mut StdRng, vote: &SimDisk, synced: usize, both: bool) -> Option<Rotted> {
    // Each save is two frames of this size.
    const SAVE: usize = 2 * (8 + crate::record::STATE_BYTES);
    let len = vote.synced_len().min(synced);
    if len < SAVE {
        return None;
    }
    let (kind, at, detail) = if both {
        let at = len - SAVE + rng.random_range(0..SAVE / 2);
        vote.rot(|b| {
            b[at] ^= 0x01;
            b[at + SAVE / 2] ^= 0x01;
        });
        (
            RotKind::VoteBoth,
            at,
            format!("both copies of the latest vote save, at {at}"),
        )
    } else {
        let at = rng.random_range(0..len);
        vote.rot(|b| b[at] ^= 0x80);
        (RotKind::Vote, at, format!("vote file byte {at}"))
    };
    Some(Rotted {
        kind,
        at,
        first_lost: None,
        detail,
    })
}

/// The aimed rot: a flipped byte in the first entry `victim` holds past `lagging_last` (the
/// last index the lagging replica has), so that neither holds the entries after it.
pub(super) fn rot_aimed(
    rng: &mut StdRng,
    log: &SimDisk,
    synced: usize,
    lagging_last: Option<u64>,
) -> Option<Rotted> {
    let bytes = log.synced_bytes();
    let synced = synced.min(bytes.len());
    let frames = frame_starts(&bytes[..synced]);
    let i = frames
        .iter()
        .position(|&(_, index)| lagging_last.is_none_or(|l| index > l))?;
    let start = frames[i].0;
    let end = frames.get(i + 1).map_or(synced, |f| f.0);
    let at = rng.random_range(start..end);
    let mut bad = bytes;
    bad[at] ^= 0x40;
    let lost = first_lost(&bad);
    log.rot(|b| *b = bad);
    Some(Rotted {
        kind: RotKind::Flip,
        at,
        first_lost: lost,
        detail: format!("byte {at} of entry {} ^= 0x40", frames[i].1),
    })
}
