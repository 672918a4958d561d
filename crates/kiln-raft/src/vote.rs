//! The `vote` file of a replica: its vote and repair guard, saved twice per write, and the
//! scan that reads them back after a crash or damage (docs/replication.md, "Damage and full
//! disks").
//!
//! Votes only grow and each save writes a whole state, so the last valid record is the latest
//! state, unless damage after it hid a later save: then the vote this replica cast may be
//! forgotten (`latest_lost`), and the repair guard's vote floor keeps it from voting until it
//! has followed a leader of a term at least as high as any it recorded.

use std::path::Path;
use std::sync::Arc;

use kiln_log::fs::{Fs, FsFile};

use crate::full_disk::{append_durably, truncate_durably};
use crate::guard::ReplicaHealth;
use crate::record::{
    decode_state, encode_state_pair, VoteState, FRAME_HEADER, STATE_BYTES, VOTE_BYTES,
};
use crate::types::Vote;

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

/// True when the frame at `at` is the beginning of a record cut short: its header runs past
/// the end of the file, or its length field is a record's size and the payload it announces
/// does. A length field that is no record's size was never written by a save (every save
/// writes whole records), so a frame whose length is wrong is damage, however far it claims to
/// run: a flipped bit in the length of the last, fsynced save must not pass for a torn write,
/// or the vote and guard it held would be forgotten without a trace.
fn frame_incomplete(buf: &[u8], at: usize) -> bool {
    let Some(header) = buf.get(at..at + FRAME_HEADER) else {
        return true;
    };
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    (len == VOTE_BYTES || len == STATE_BYTES) && buf.len() < at + FRAME_HEADER + len
}

/// True when the bytes from `at` on are what a crash leaves of an unsynced write: zeros only
/// (the file grew, the data never landed), or a record cut short. Not when the bytes present are
/// a whole frame whose length field is wrong (its CRC matches them), nor a length field that no
/// save writes: that is damage.
fn is_torn(buf: &[u8], at: usize) -> bool {
    let rest = buf.get(at..).unwrap_or(&[]);
    if rest.iter().all(|&b| b == 0) {
        return true;
    }
    if !frame_incomplete(buf, at) {
        return false;
    }
    match (rest.get(4..8), rest.get(FRAME_HEADER..)) {
        (Some(crc), Some(payload)) if !payload.is_empty() => {
            crc != crc32c::crc32c(payload).to_be_bytes()
        }
        _ => true,
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

/// The `vote` file and its length. Writers take it in turn (openraft's `save_vote` and the
/// lifting of the guard), so a write cut back after a full disk never cuts another's record.
pub(crate) struct VoteFile {
    file: Arc<dyn FsFile>,
    len: u64,
}

impl VoteFile {
    /// Opens (creating) and scans `path`; a damaged or torn tail is cut durably.
    pub(crate) async fn open(
        fs: &dyn Fs,
        path: &Path,
        health: &ReplicaHealth,
    ) -> std::io::Result<(VoteFile, VoteScan)> {
        let existed = fs.exists(path);
        let file = fs.open(path, true)?;
        if !existed {
            file.sync_now()?;
            if let Some(dir) = path.parent() {
                fs.sync_dir(dir)?;
            }
        }
        let len = file.len()?;
        let mut buf = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
        file.read_exact_at(&mut buf, 0)?;
        let scan = scan_vote(&buf);
        let mut vf = VoteFile { file, len };
        if (scan.end as u64) < len {
            truncate_durably(&vf.file, scan.end as u64, health).await?;
            vf.len = scan.end as u64;
        }
        Ok((vf, scan))
    }

    /// Saves `state` (two copies, one write, one fsync), waiting out a full disk.
    pub(crate) async fn save(
        &mut self,
        state: &VoteState,
        health: &ReplicaHealth,
    ) -> std::io::Result<()> {
        let bytes = encode_state_pair(state);
        append_durably(&self.file, self.len, &bytes, health).await?;
        self.len += bytes.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use openraft::{CommittedLeaderId, RaftMetrics};

    use super::*;
    use crate::guard::Guard;
    use crate::types::LogId;

    fn lid(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 0), index)
    }

    // ----- the vote file -----

    fn save(file: &mut Vec<u8>, term: u64, node: u64, guard: Guard) -> usize {
        let at = file.len();
        file.extend_from_slice(&encode_state_pair(&VoteState {
            vote: Some(Vote::new(term, node)),
            guard,
        }));
        at
    }

    const RECORD: usize = 8 + STATE_BYTES;

    #[test]
    fn the_last_record_wins_and_one_damaged_copy_loses_nothing() {
        let mut file = Vec::new();
        save(&mut file, 1, 1, Guard::default());
        save(&mut file, 2, 3, Guard::default());
        let last = save(&mut file, 3, 2, Guard::default());
        let scan = scan_vote(&file);
        assert_eq!(scan.state.unwrap().vote, Some(Vote::new(3, 2)));
        assert_eq!(scan.report.records, 6);
        assert!(!scan.report.latest_lost);
        for (pos, what) in [
            (last + 20, "first copy"),
            (last + RECORD + 20, "second copy"),
        ] {
            let mut bad = file.clone();
            bad[pos] ^= 0x04;
            let scan = scan_vote(&bad);
            assert_eq!(scan.state.unwrap().vote, Some(Vote::new(3, 2)), "{what}");
            assert!(!scan.report.latest_lost, "{what}");
            assert_eq!(scan.report.damaged_bytes, RECORD as u64, "{what}");
        }
        // Both copies of an older save damaged: later saves supersede it.
        let mut bad = file.clone();
        bad[RECORD * 2 + 9] ^= 1;
        bad[RECORD * 3 + 9] ^= 1;
        let scan = scan_vote(&bad);
        assert_eq!(scan.state.unwrap().vote, Some(Vote::new(3, 2)));
        assert!(!scan.report.latest_lost);
    }

    #[test]
    fn losing_both_copies_of_the_latest_save_sets_a_vote_floor() {
        let mut file = Vec::new();
        save(&mut file, 4, 1, Guard::default());
        let last = save(&mut file, 7, 2, Guard::default());
        file[last + 12] ^= 0x40;
        file[last + RECORD + 12] ^= 0x40;
        let scan = scan_vote(&file);
        assert!(scan.report.latest_lost);
        // The surviving state is the one before; the floor is the highest term seen anywhere.
        assert_eq!(scan.state.unwrap().vote, Some(Vote::new(4, 1)));
        assert_eq!(scan.highest_term, Some(4));
        assert_eq!(scan.end, last, "the damaged tail is cut");
        // A flipped bit in both length fields makes each frame claim to run past the end of
        // the file, as a torn write would; but no save writes a frame of that length, so it is
        // damage, and the save (with the guard it may hold) is lost, not never written.
        for byte in 0..4 {
            let mut bad = file.clone();
            bad[last + byte] ^= 0x01;
            bad[last + RECORD + byte] ^= 0x01;
            let scan = scan_vote(&bad);
            assert!(scan.report.latest_lost, "length byte {byte}");
            assert_eq!(scan.state.unwrap().vote, Some(Vote::new(4, 1)));
        }
        // A torn save (a crash before its fsync: it was never cast) is no loss.
        let mut torn = Vec::new();
        save(&mut torn, 4, 1, Guard::default());
        let whole = torn.len();
        save(&mut torn, 7, 2, Guard::default());
        for cut in whole + 1..torn.len() {
            let scan = scan_vote(&torn[..cut]);
            let expect = if cut >= whole + RECORD { 7 } else { 4 };
            assert!(!scan.report.latest_lost, "cut at {cut}");
            assert_eq!(scan.state.unwrap().vote.unwrap().leader_id.term, expect);
        }
    }

    #[test]
    fn the_older_single_copy_format_is_read_and_its_damage_is_a_loss() {
        let mut file = Vec::new();
        for term in [1u64, 2] {
            let mut p = Vec::new();
            crate::record::encode_vote_payload(&Vote::new(term, 1), &mut p);
            file.extend_from_slice(&crate::record::frame(&p));
        }
        let scan = scan_vote(&file);
        assert_eq!(scan.state.unwrap().vote, Some(Vote::new(2, 1)));
        let last = file.len() - 1;
        file[last] ^= 1;
        let scan = scan_vote(&file);
        assert!(scan.report.latest_lost);
        assert_eq!(scan.highest_term, Some(1));
    }

    #[test]
    fn the_guard_is_read_back_from_the_latest_save() {
        let mut file = Vec::new();
        let guard = Guard::repair(41, Some(6)).merge(Guard::vote_floor(6));
        save(&mut file, 6, 2, guard);
        assert_eq!(scan_vote(&file).state.unwrap().guard, guard);
        save(&mut file, 6, 2, Guard::default());
        assert!(scan_vote(&file).state.unwrap().guard.is_clear());
    }

    #[test]
    fn a_vote_floor_is_met_only_by_following_a_leader_of_that_term_since_start() {
        let guard = Guard::vote_floor(5);
        let mut m = RaftMetrics::new_initial(1);
        // Recovered as the committed vote for term 5, but nothing heard since starting.
        m.vote = Vote::new_committed(5, 2);
        assert!(!guard.met_by(&m));
        m.last_applied = Some(lid(5, 9));
        assert!(guard.met_by(&m));
        // A leader of an older term is not enough; nor an uncommitted (candidate's) vote.
        m.vote = Vote::new_committed(4, 2);
        assert!(!guard.met_by(&m));
        m.vote = Vote::new(6, 3);
        assert!(!guard.met_by(&m));
        // Repair: applied through the highest index the damaged log held, or an entry of a term
        // after every term it had acknowledged entries in.
        let repair = Guard::repair(12, Some(6));
        m.last_applied = Some(lid(6, 11));
        assert!(!repair.met_by(&m));
        m.last_applied = Some(lid(6, 12));
        assert!(repair.met_by(&m));
        m.last_applied = Some(lid(7, 8));
        assert!(repair.met_by(&m));
        assert!(
            !Guard::repair(12, None).met_by(&m),
            "term unknown: only the index counts"
        );
        // The index the damaged log reached unknown (its save lost): only a later term lifts.
        let unknown = Guard::repair_unknown(6);
        m.last_applied = Some(lid(6, u64::MAX - 1));
        assert!(!unknown.met_by(&m));
        m.last_applied = Some(lid(7, 1));
        assert!(unknown.met_by(&m));
        let merged = Guard::repair(12, Some(6)).merge(Guard::repair_unknown(6));
        assert_eq!(merged, Guard::repair_unknown(6));
        // Merging keeps the stricter targets, and the term rule only if both know it.
        let merged = Guard::repair(12, Some(6)).merge(Guard::repair(20, None));
        assert_eq!((merged.repair_until, merged.repair_term), (Some(20), None));
        let merged = Guard::repair(12, Some(6)).merge(Guard::repair(9, Some(8)));
        assert_eq!(
            (merged.repair_until, merged.repair_term),
            (Some(12), Some(8))
        );
    }
}
