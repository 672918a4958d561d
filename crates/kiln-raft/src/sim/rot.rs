//! Bit rot: damage to the synced bytes of a replica that is down, and the aimed scenario in
//! which a replica without the repair guard would lose an acknowledged record.
//!
//! Damage goes into the durable bytes of the data replica's segment files or its `vote`
//! file: a flipped byte, a run of bytes missing, a garbage length field, zeros over the last
//! synced entries (the case a segment header's synced claim exists for), and damage to the
//! vote file. Recovery must see each as damage, never as a torn write.

use std::path::{Path, PathBuf};

use kiln_log::header::HEADER_LEN;
use kiln_log::sim_fs::SimFs;
use kiln_log::BatchHeader;
use rand::Rng;

use crate::rng::StableRng;
use crate::types::NodeId;

/// The kinds of damage, in the order of their trace names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RotKind {
    /// One byte XORed with a random non-zero value.
    Flip,
    /// A run of 1-64 bytes gone from a segment; what follows moves up.
    Hole,
    /// A batch's length field overwritten with a random value.
    Length,
    /// Zeros over the last one to three synced entries of the last segment.
    TailZeros,
    /// One byte of the `vote` file flipped (a single damaged copy loses nothing).
    Vote,
    /// One byte flipped in each copy of the latest `vote` save: the vote is lost.
    VoteBoth,
}

/// What a rot did.
pub(super) struct Rotted {
    pub(super) kind: RotKind,
    /// Byte position of the damage in its file.
    pub(super) at: usize,
    /// For the log: the entry the damage hit.
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

/// One stored batch in a segment file: where it is and the entry it belongs to.
struct Stored {
    pos: usize,
    len: usize,
    index: u64,
    ends_entry: bool,
}

/// The durable segment files under `dir`, oldest first, with their contents.
fn segments(fs: &SimFs, dir: &Path) -> Vec<(PathBuf, u64, Vec<u8>)> {
    let mut files: Vec<(PathBuf, u64, Vec<u8>)> = fs
        .durable_files(dir)
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "log"))
        .filter_map(|(p, _)| {
            let base = p.file_stem()?.to_str()?.parse::<u64>().ok()?;
            let bytes = fs.durable_bytes(&p)?;
            Some((p, base, bytes))
        })
        .collect();
    files.sort_by_key(|f| f.1);
    files
}

/// The whole, valid batches of a segment file.
fn batches(bytes: &[u8], base_index: u64) -> Vec<Stored> {
    let mut out = Vec::new();
    let mut pos = HEADER_LEN as usize;
    let mut index = base_index;
    while let Some(rest) = bytes.get(pos..) {
        let Ok(h) = BatchHeader::parse(rest) else {
            break;
        };
        let len = h.total_len();
        if rest.len() < len {
            break;
        }
        out.push(Stored {
            pos,
            len,
            index,
            ends_entry: h.ends_entry(),
        });
        if h.ends_entry() {
            index += 1;
        }
        pos += len;
    }
    out
}

/// Damages the data replica's durable files under `dir` (log segments or `vote`), picking the
/// kind at random. `None` if there was nothing synced to damage.
pub(super) fn rot_at_random(rng: &mut StableRng, fs: &SimFs, dir: &Path) -> Option<Rotted> {
    let roll = rng.random_range(0..100);
    if roll >= 80 {
        return rot_vote(rng, fs, &dir.join("vote"), roll >= 90);
    }
    let files = segments(fs, dir);
    let (path, base, bytes) = files.get(rng.random_range(0..files.len().max(1)))?.clone();
    let stored = batches(&bytes, base);
    if stored.len() < 2 {
        return None;
    }
    let mut bad = bytes.clone();
    let (kind, at, detail) = match roll {
        0..=39 => {
            let at = rng.random_range(HEADER_LEN as usize..bytes.len());
            let mask: u8 = rng.random_range(1..=255);
            bad[at] ^= mask;
            (
                RotKind::Flip,
                at,
                format!("{} byte {at} ^= {mask:#04x}", path.display()),
            )
        }
        40..=54 => {
            let last = stored.last().map_or(0, |s| s.pos);
            let at = rng.random_range(HEADER_LEN as usize..last);
            let len = rng.random_range(1..=64).min(last - at);
            bad.drain(at..at + len);
            (
                RotKind::Hole,
                at,
                format!("{len} bytes gone at {at} of {}", path.display()),
            )
        }
        55..=69 => {
            let s = &stored[rng.random_range(0..stored.len())];
            let len: u32 = rng.random();
            bad[s.pos + 8..s.pos + 12].copy_from_slice(&len.to_be_bytes());
            (
                RotKind::Length,
                s.pos,
                format!("length field of a batch of entry {} := {len}", s.index),
            )
        }
        _ => {
            // The last segment's last entries, zeroed to the end of the file.
            let (path, base, bytes) = files.last()?.clone();
            let stored = batches(&bytes, base);
            let ends: Vec<&Stored> = stored.iter().filter(|s| s.ends_entry).collect();
            if ends.len() < 2 {
                return None;
            }
            let entries = rng.random_range(1..=3usize).min(ends.len() - 1);
            let from_entry = ends[ends.len() - entries].index;
            let at = stored.iter().find(|s| s.index == from_entry)?.pos;
            let mut bad = bytes.clone();
            bad[at..].fill(0);
            let first = Some(from_entry);
            fs.rot(&path, |b| *b = bad);
            return Some(Rotted {
                kind: RotKind::TailZeros,
                at,
                first_lost: first,
                detail: format!(
                    "zeros over the last {entries} entries of {} from byte {at}",
                    path.display()
                ),
            });
        }
    };
    let first_lost = stored.iter().find(|s| at < s.pos + s.len).map(|s| s.index);
    fs.rot(&path, |b| *b = bad);
    Some(Rotted {
        kind,
        at,
        first_lost,
        detail,
    })
}

fn rot_vote(rng: &mut StableRng, fs: &SimFs, path: &Path, both: bool) -> Option<Rotted> {
    // Each save is two frames of this size.
    const SAVE: usize = 2 * (8 + crate::record::STATE_BYTES);
    let len = fs.durable_bytes(path)?.len();
    if len < SAVE {
        return None;
    }
    let (kind, at, detail) = if both {
        let at = len - SAVE + rng.random_range(0..SAVE / 2);
        fs.rot(path, |b| {
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
        fs.rot(path, |b| b[at] ^= 0x80);
        (RotKind::Vote, at, format!("vote file byte {at}"))
    };
    Some(Rotted {
        kind,
        at,
        first_lost: None,
        detail,
    })
}

/// The aimed rot: a flipped byte in the first entry the victim holds past `lagging_last` (the
/// last index the lagging replica has), so that neither holds the entries after it.
pub(super) fn rot_aimed(
    rng: &mut StableRng,
    fs: &SimFs,
    dir: &Path,
    lagging_last: Option<u64>,
) -> Option<Rotted> {
    for (path, base, bytes) in segments(fs, dir) {
        let stored = batches(&bytes, base);
        let Some(s) = stored
            .iter()
            .find(|s| lagging_last.is_none_or(|l| s.index > l))
        else {
            continue;
        };
        let at = rng.random_range(s.pos..s.pos + s.len);
        let index = s.index;
        fs.rot(&path, |b| b[at] ^= 0x40);
        return Some(Rotted {
            kind: RotKind::Flip,
            at,
            first_lost: Some(index),
            detail: format!("byte {at} of entry {index} in {} ^= 0x40", path.display()),
        });
    }
    None
}
