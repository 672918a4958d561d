//! Recovery classification: torn tail, bit flips, holes, garbage length fields; and the
//! vote file's damage rule.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use bytes::Bytes;
use openraft::{CommittedLeaderId, EntryPayload, Membership, RaftMetrics};

use super::*;
use crate::guard::Guard;
use crate::record::{encode_entry, encode_state_pair, VoteState, STATE_BYTES};
use crate::types::{Batches, LogId, Vote};

fn lid(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 0), index)
}

/// A log of `n` entries from index 0 (membership, blanks and data of varied sizes), and the
/// byte position of each frame.
fn log(n: u64) -> (Vec<u8>, Vec<usize>) {
    let mut buf = Vec::new();
    let mut starts = Vec::new();
    for i in 0..n {
        let payload = match i % 3 {
            0 if i == 0 => EntryPayload::Membership(Membership::new(
                vec![BTreeSet::from([1, 2, 3])],
                BTreeSet::from([1, 2, 3]),
            )),
            0 => EntryPayload::Blank,
            _ => EntryPayload::Normal(Batches(Bytes::from(vec![b'r'; 20 + 7 * i as usize]))),
        };
        starts.push(buf.len());
        buf.extend_from_slice(&encode_entry(&Entry {
            log_id: lid(1 + i / 4, i),
            payload,
        }));
    }
    (buf, starts)
}

fn damage(tail: LogTail) -> LogDamage {
    match tail {
        LogTail::Damaged(d) => d,
        other => panic!("expected damage, got {other:?}"),
    }
}

#[test]
fn a_whole_log_is_clean() {
    let (buf, _) = log(8);
    let scan = scan_log(&buf);
    assert_eq!(
        (scan.entries.len(), scan.end, scan.tail),
        (8, buf.len(), LogTail::Clean)
    );
}

#[test]
fn a_crash_cut_at_any_byte_is_a_torn_tail_not_damage() {
    let (buf, starts) = log(6);
    for cut in 1..buf.len() {
        let scan = scan_log(&buf[..cut]);
        let whole = starts.iter().filter(|&&s| s < cut).count() - 1;
        if starts.contains(&cut) {
            assert_eq!(scan.tail, LogTail::Clean, "cut at {cut}");
        } else {
            assert_eq!(scan.tail, LogTail::Torn, "cut at {cut}");
            assert_eq!(scan.entries.len(), whole, "cut at {cut}");
        }
    }
    // Zeros where the file grew but the data never landed: torn too.
    let mut grown = buf.clone();
    grown.extend_from_slice(&[0u8; 4096]);
    assert_eq!(scan_log(&grown).tail, LogTail::Torn);
}

#[test]
fn a_bit_flip_in_the_middle_is_damage_and_the_frames_after_it_are_counted() {
    let (mut buf, starts) = log(10);
    buf[starts[4] + 30] ^= 0x10;
    let scan = scan_log(&buf);
    assert_eq!(scan.entries.len(), 4);
    assert_eq!(scan.end, starts[4]);
    let d = damage(scan.tail);
    assert_eq!(d.cause, DamageCause::Checksum);
    assert_eq!(d.at_byte, starts[4] as u64);
    assert_eq!(d.first_lost_index, 4);
    assert_eq!(d.highest_index_after, Some(9));
    assert_eq!(d.frames_after, 5);
    assert_eq!(d.highest_index_before(), 9);
    // Read to the end of the file: the highest term is known.
    assert_eq!(d.highest_term, Some(3));
}

#[test]
fn every_single_byte_flip_is_damage_that_knows_the_last_index() {
    let (buf, starts) = log(7);
    for pos in 0..buf.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut bad = buf.clone();
            bad[pos] ^= mask;
            let scan = scan_log(&bad);
            let frame = starts.iter().filter(|&&s| s <= pos).count() - 1;
            let d = damage(scan.tail);
            assert!(scan.entries.len() <= frame, "flip at {pos}");
            assert_eq!(d.first_lost_index, scan.entries.len() as u64);
            assert_eq!(
                d.highest_index_before(),
                6,
                "flip {mask:#x} at {pos}: {d:?}"
            );
        }
    }
}

#[test]
fn a_hole_in_the_middle_is_damage() {
    let (buf, starts) = log(10);
    // 17 bytes vanish from the middle of entry 5; everything after shifts.
    let mut holed = buf[..starts[5] + 12].to_vec();
    holed.extend_from_slice(&buf[starts[5] + 29..]);
    let d = damage(scan_log(&holed).tail);
    assert_eq!(d.first_lost_index, 5);
    assert_eq!(d.highest_index_after, Some(9));
    assert_eq!(d.frames_after, 4);
    // A hole that takes the end of one frame and the start of the next.
    let mut holed = buf[..starts[3] + 20].to_vec();
    holed.extend_from_slice(&buf[starts[4] + 5..]);
    let d = damage(scan_log(&holed).tail);
    assert_eq!(d.first_lost_index, 3);
    assert_eq!(d.highest_index_after, Some(9));
}

#[test]
fn a_garbage_length_field_is_damage_found_by_scanning_byte_by_byte() {
    let (buf, starts) = log(10);
    // Past the largest record: refused from the header.
    let mut bad = buf.clone();
    bad[starts[2]..starts[2] + 4].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    let d = damage(scan_log(&bad).tail);
    assert_eq!(d.cause, DamageCause::Length);
    assert_eq!((d.first_lost_index, d.highest_index_after), (2, Some(9)));
    // Plausible but wrong, running past the end of the file: looks like a torn frame, but
    // the frames after it give it away.
    let mut bad = buf.clone();
    bad[starts[2]..starts[2] + 4].copy_from_slice(&(1u32 << 20).to_be_bytes());
    let d = damage(scan_log(&bad).tail);
    assert_eq!((d.first_lost_index, d.highest_index_after), (2, Some(9)));
    assert_eq!(d.frames_after, 7);
}

#[test]
fn a_wrong_length_in_the_last_frame_is_damage_not_a_torn_tail() {
    let (buf, starts) = log(5);
    // Longer than the file: the bytes present are still a whole frame (their CRC matches).
    let mut bad = buf.clone();
    let len = (buf.len() - starts[4] - 8) as u32;
    bad[starts[4]..starts[4] + 4].copy_from_slice(&(len + 100).to_be_bytes());
    let d = damage(scan_log(&bad).tail);
    assert_eq!((d.first_lost_index, d.highest_index_after), (4, None));
    assert_eq!(d.highest_index_before(), 4);
    assert_eq!(d.highest_term, None, "the end of the file is unreadable");
    // A flip in the last frame's payload: the frame is whole, its CRC wrong.
    let mut bad = buf.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let d = damage(scan_log(&bad).tail);
    assert_eq!((d.cause, d.first_lost_index), (DamageCause::Checksum, 4));
}

#[test]
fn an_index_gap_behind_a_valid_crc_is_damage() {
    let (buf, starts) = log(4);
    let mut gapped = buf[..starts[2]].to_vec();
    gapped.extend_from_slice(&buf[starts[3]..]);
    let d = damage(scan_log(&gapped).tail);
    assert_eq!((d.cause, d.first_lost_index), (DamageCause::Index, 2));
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
    // Merging keeps the stricter targets, and the term rule only if both know it.
    let merged = Guard::repair(12, Some(6)).merge(Guard::repair(20, None));
    assert_eq!((merged.repair_until, merged.repair_term), (Some(20), None));
    let merged = Guard::repair(12, Some(6)).merge(Guard::repair(9, Some(8)));
    assert_eq!(
        (merged.repair_until, merged.repair_term),
        (Some(12), Some(8))
    );
}
