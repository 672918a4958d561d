//! What a replica finds in its two files when it starts, and how it tells a torn tail (a
//! crash cut an unsynced write short: nobody acknowledged it, cut it and carry on) from damage
//! (bytes this replica had synced, and may have acknowledged, no longer read back: cut them and
//! repair from the peers before voting again). docs/replication.md, "Damage and full disks".
//!
//! Both scans are pure functions of the file's bytes, so the unit tests below drive them with
//! hand-made damage.

use crate::guard::Guard;
use crate::record::{
    decode_entry, decode_state, FRAME_HEADER, MAX_RECORD_BYTES, MIN_ENTRY_PAYLOAD, STATE_BYTES,
    VOTE_BYTES,
};
use crate::types::{Entry, Vote};

/// The smallest whole `raft.log` frame.
const MIN_FRAME: usize = FRAME_HEADER + MIN_ENTRY_PAYLOAD;

/// Why the first frame recovery did not keep was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DamageCause {
    /// The length field is past the largest record ever written.
    Length,
    /// The CRC32C does not match the payload.
    Checksum,
    /// A valid CRC over a payload that does not decode as an entry.
    Payload,
    /// A whole, valid entry whose index does not follow the one before it.
    Index,
}

/// Damage in `raft.log`: data this replica had synced is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogDamage {
    pub cause: DamageCause,
    /// Byte position of the first frame that was not kept.
    pub at_byte: u64,
    /// Raft index of the first entry lost (the one after the last entry kept).
    pub first_lost_index: u64,
    /// Highest Raft index in a CRC-valid frame found after the damage; `None` when nothing
    /// after it reads back.
    pub highest_index_after: Option<u64>,
    /// CRC-valid frames found after the damage. None of them is kept or served: a frame after
    /// a hole is not known to belong to this log's history.
    pub frames_after: usize,
    /// The highest term of any entry in the file, when it is known: frames were found after
    /// the damage and read to the end of the file (terms never decrease along the log, so the
    /// damaged stretch holds none higher). `None` when the damage runs to the end.
    pub highest_term: Option<u64>,
}

impl LogDamage {
    /// The highest index this replica's log held before the damage, as far as can be told: the
    /// replica repairs until it has applied past it.
    pub fn highest_index_before(&self) -> u64 {
        self.highest_index_after
            .unwrap_or(self.first_lost_index)
            .max(self.first_lost_index)
    }
}

/// How `raft.log` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogTail {
    /// At a frame boundary: nothing cut.
    #[default]
    Clean,
    /// An incomplete final frame, or zero bytes the file had grown by: a write a crash cut
    /// short before its fsync. Nobody acknowledged it, so no repair is needed.
    Torn,
    /// Frames this replica had synced are gone: it repairs before it votes again.
    Damaged(LogDamage),
}

/// What the scan of the `vote` file found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VoteRecovery {
    /// Valid records found (each save writes two).
    pub records: usize,
    /// Bytes in damaged regions (not counting a torn tail).
    pub damaged_bytes: u64,
    /// Bytes cut from the end (a torn tail, or damage after the last valid record).
    pub cut_bytes: u64,
    /// No intact copy of the latest save survived: the vote it held is unknown, so the replica
    /// neither votes nor stands until it has followed a leader in a term at least
    /// `vote_floor` (see [`Guard`]).
    pub latest_lost: bool,
}

/// What recovery found and cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogRecovery {
    /// Entries kept.
    pub entries: usize,
    /// Bytes cut from the end of `raft.log`.
    pub cut_bytes: u64,
    pub tail: LogTail,
    pub vote: VoteRecovery,
    /// The guard the replica starts under (persisted in `vote`, so a restart before the
    /// repair is over keeps it).
    pub guard: Guard,
}

impl LogRecovery {
    /// True when the replica starts repairing: it neither votes nor stands for election until
    /// a leader has refilled its log (see [`crate::ReplicatedPartition::repairing`]).
    pub fn repairing(&self) -> bool {
        !self.guard.is_clear()
    }
}

/// The result of scanning `raft.log`.
pub(crate) struct LogScan {
    /// Kept entries with the byte position of their frame.
    pub(crate) entries: Vec<(u64, Entry)>,
    /// Length of the kept prefix.
    pub(crate) end: usize,
    pub(crate) tail: LogTail,
}

enum Frame<'a> {
    Whole {
        payload: &'a [u8],
        end: usize,
    },
    /// The header, or the payload its length field announces, runs past the end of the file.
    Incomplete,
    Bad(DamageCause),
}

fn parse_frame(buf: &[u8], at: usize) -> Frame<'_> {
    let Some(header) = buf.get(at..at + FRAME_HEADER) else {
        return Frame::Incomplete;
    };
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_RECORD_BYTES {
        return Frame::Bad(DamageCause::Length);
    }
    let end = at + FRAME_HEADER + len;
    let Some(payload) = buf.get(at + FRAME_HEADER..end) else {
        return Frame::Incomplete;
    };
    if crc32c::crc32c(payload) != crc {
        return Frame::Bad(DamageCause::Checksum);
    }
    Frame::Whole { payload, end }
}

/// True when the bytes from `at` on are what a crash leaves of an unsynced write: zeros only
/// (the file grew, the data never landed), or a frame cut short. Not when the bytes present are
/// a whole frame whose length field is wrong (its CRC matches them): that is damage.
fn is_torn(buf: &[u8], at: usize) -> bool {
    let rest = buf.get(at..).unwrap_or(&[]);
    if rest.iter().all(|&b| b == 0) {
        return true;
    }
    if !matches!(parse_frame(buf, at), Frame::Incomplete) {
        return false;
    }
    match (rest.get(4..8), rest.get(FRAME_HEADER..)) {
        (Some(crc), Some(payload)) if !payload.is_empty() => {
            crc != crc32c::crc32c(payload).to_be_bytes()
        }
        _ => true,
    }
}

/// A frame at `at` that looks like one of this log's entries after damage at `damage_at`:
/// whole, CRC-valid, the node field zero (the format always writes 0), a known kind, an index
/// that `expect`s the one before it or, for the first after a gap, lies between the first lost
/// index and as far as the bytes since the damage could have advanced it. Returns its index,
/// term and end.
fn plausible_entry(
    buf: &[u8],
    at: usize,
    damage_at: usize,
    first_lost: u64,
    expect: Option<u64>,
) -> Option<(u64, u64, usize)> {
    let header = buf.get(at..at + FRAME_HEADER)?;
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if !(MIN_ENTRY_PAYLOAD..=MAX_RECORD_BYTES).contains(&len) {
        return None;
    }
    let payload = buf.get(at + FRAME_HEADER..at + FRAME_HEADER + len)?;
    // Cheap checks before the CRC: this runs at every byte of a damaged region.
    if payload.get(8..16)? != [0u8; 8] || *payload.get(24)? > 2 {
        return None;
    }
    let index = u64::from_be_bytes(payload.get(16..24)?.try_into().ok()?);
    let plausible = match expect {
        Some(e) => index == e,
        None => {
            let reach = ((at - damage_at) / MIN_FRAME) as u64 + 1;
            index >= first_lost && index <= first_lost.saturating_add(reach)
        }
    };
    if !plausible || crc32c::crc32c(payload).to_be_bytes() != header[4..8] {
        return None;
    }
    let entry = decode_entry(payload)?;
    Some((index, entry.log_id.leader_id.term, at + FRAME_HEADER + len))
}

/// What [`scan_after`] found.
struct After {
    frames: usize,
    highest_index: Option<u64>,
    highest_term: u64,
    /// Where the last frame found ends.
    end: usize,
}

/// Looks past damage at `damage_at` for later frames of the log: frame by frame while they
/// chain, byte by byte where they do not (a garbage length field says nothing about where the
/// next frame starts).
fn scan_after(buf: &[u8], damage_at: usize, first_lost: u64) -> After {
    let mut found = 0;
    let mut highest: Option<u64> = None;
    let mut highest_term = 0;
    let mut last_end = 0;
    let mut at = damage_at + 1;
    let mut expect = None;
    while at + MIN_FRAME <= buf.len() {
        match plausible_entry(buf, at, damage_at, first_lost, expect) {
            Some((index, term, end)) => {
                found += 1;
                highest = highest.max(Some(index));
                highest_term = highest_term.max(term);
                expect = Some(index + 1);
                at = end;
                last_end = end;
            }
            None => {
                expect = None;
                at += 1;
            }
        }
    }
    After {
        frames: found,
        highest_index: highest,
        highest_term,
        end: last_end,
    }
}

/// Keeps the longest prefix of whole, CRC-valid, index-contiguous entries, and says what the
/// rest was.
pub(crate) fn scan_log(buf: &[u8]) -> LogScan {
    let mut entries: Vec<(u64, Entry)> = Vec::new();
    let mut at = 0usize;
    let cause = loop {
        if at == buf.len() {
            return LogScan {
                entries,
                end: at,
                tail: LogTail::Clean,
            };
        }
        let (payload, end) = match parse_frame(buf, at) {
            Frame::Whole { payload, end } => (payload, end),
            Frame::Incomplete => break None,
            Frame::Bad(cause) => break Some(cause),
        };
        let Some(entry) = decode_entry(payload) else {
            break Some(DamageCause::Payload);
        };
        if let Some((_, last)) = entries.last() {
            if entry.log_id.index != last.log_id.index + 1 {
                break Some(DamageCause::Index);
            }
        }
        entries.push((at as u64, entry));
        at = end;
    };
    let first_lost = entries.last().map_or(0, |(_, e)| e.log_id.index + 1);
    let after = scan_after(buf, at, first_lost);
    let tail = if after.frames == 0 && is_torn(buf, at) {
        LogTail::Torn
    } else {
        let kept_term = entries.last().map_or(0, |(_, e)| e.log_id.leader_id.term);
        let read_to_end = after.frames > 0 && (after.end == buf.len() || is_torn(buf, after.end));
        LogTail::Damaged(LogDamage {
            cause: cause.unwrap_or(DamageCause::Length),
            at_byte: at as u64,
            first_lost_index: first_lost,
            highest_index_after: after.highest_index,
            frames_after: after.frames,
            highest_term: read_to_end.then_some(kept_term.max(after.highest_term)),
        })
    };
    LogScan {
        entries,
        end: at,
        tail,
    }
}

/// The result of scanning `vote`.
pub(crate) struct VoteScan {
    /// The latest state a valid record holds (`None`: no valid record).
    pub(crate) state: Option<crate::record::VoteState>,
    /// The highest term in any valid record.
    pub(crate) highest_term: Option<u64>,
    /// Where the file should end: after the last valid record.
    pub(crate) end: usize,
    pub(crate) report: VoteRecovery,
}

/// A `vote` record at `at`: whole, CRC-valid, of a record size, decodable.
fn vote_record_at(buf: &[u8], at: usize) -> Option<(crate::record::StateRecord, usize)> {
    let header = buf.get(at..at + FRAME_HEADER)?;
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len != VOTE_BYTES && len != STATE_BYTES {
        return None;
    }
    let payload = buf.get(at + FRAME_HEADER..at + FRAME_HEADER + len)?;
    if crc32c::crc32c(payload).to_be_bytes() != header[4..8] {
        return None;
    }
    Some((decode_state(payload)?, at + FRAME_HEADER + len))
}

/// Reads every valid record, stepping byte by byte over damage. Votes only grow, and each
/// save writes a whole state, so the last valid record is the latest state unless damage
/// after it hid a later save: then the latest state is unknown (`latest_lost`), except where
/// the damage is exactly the second copy of that last record.
pub(crate) fn scan_vote(buf: &[u8]) -> VoteScan {
    let mut at = 0usize;
    let mut last: Option<(crate::record::StateRecord, usize)> = None;
    let mut highest_term: Option<u64> = None;
    let mut records = 0;
    let mut damaged = 0u64;
    let mut gap_from: Option<usize> = None;
    while at < buf.len() {
        match vote_record_at(buf, at) {
            Some((record, end)) => {
                if let Some(from) = gap_from.take() {
                    damaged += (at - from) as u64;
                }
                records += 1;
                let term = record.state.vote.map(|v: Vote| v.leader_id.term);
                highest_term = highest_term.max(term);
                last = Some((record, end));
                at = end;
            }
            None => {
                gap_from.get_or_insert(at);
                at += 1;
            }
        }
    }
    let end = last.map_or(0, |(_, end)| end);
    let tail_len = buf.len() - end;
    let mut report = VoteRecovery {
        records,
        damaged_bytes: damaged,
        cut_bytes: tail_len as u64,
        latest_lost: false,
    };
    if tail_len > 0 && !is_torn(buf, end) {
        let twin_of_last = matches!(last, Some((r, _)) if r.copy == Some(0))
            && tail_len == FRAME_HEADER + STATE_BYTES;
        report.damaged_bytes += tail_len as u64;
        report.latest_lost = !twin_of_last;
    }
    VoteScan {
        state: last.map(|(r, _)| r.state),
        highest_term,
        end,
        report,
    }
}

#[cfg(test)]
mod tests;
