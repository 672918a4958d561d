//! Offset translation between Raft log indexes and Kafka offsets.
//!
//! Every Raft entry takes one index, but only data entries take Kafka offsets: a blank entry
//! (written by each new leader) or a membership entry takes none, and a data entry holding N
//! records takes N consecutive offsets. So the two numberings drift apart and must be translated
//! explicitly, never assumed equal.
//!
//! The translator holds one row per data entry, `(raft index, base offset, record count)`, in
//! index order. Everything else follows from it:
//!
//! * raft index → Kafka offset range ([`OffsetTranslator::offsets_of`]);
//! * commit index → high watermark: the offset after every data entry at or below the commit
//!   index ([`OffsetTranslator::next_offset_through`]); consumers read strictly below it;
//! * Kafka offset → the data entry that holds it ([`OffsetTranslator::entry_for_offset`]), for
//!   reads;
//! * truncation of an uncommitted tail ([`OffsetTranslator::truncate_from`]) removes rows and
//!   gives their offsets back, so the next entry reuses them (they were never committed, so no
//!   consumer ever saw them).
//!
//! It is rebuilt from the log on restart by replaying [`OffsetTranslator::append`] over the
//! stored entries. The Kafka leader epoch is the Raft term of the entry (see
//! `docs/replication.md`).

use std::ops::Range;

/// One data entry: the Raft index it sits at and the Kafka offsets its records take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataEntry {
    pub raft_index: u64,
    pub base_offset: i64,
    pub record_count: u32,
}

impl DataEntry {
    /// The Kafka offsets this entry's records take.
    pub fn offsets(&self) -> Range<i64> {
        self.base_offset..self.base_offset + i64::from(self.record_count)
    }
}

/// Errors from [`OffsetTranslator::append`]: each is a caller bug (entries out of order).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    #[error("raft index {index} is not after the last translated index {last}")]
    IndexNotIncreasing { index: u64, last: u64 },
}

/// Raft index ↔ Kafka offset translation for one partition (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OffsetTranslator {
    /// Data entries in increasing raft index order; offsets contiguous from `log_start_offset`.
    rows: Vec<DataEntry>,
    /// Highest raft index seen (data or not), if any.
    last_index: Option<u64>,
    /// The Kafka offset of the first record (0 until retention exists).
    log_start_offset: i64,
}

impl OffsetTranslator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the entry at `raft_index` holding `record_count` records (0 for blank and
    /// membership entries) and returns the Kafka offsets it takes (empty for 0 records).
    /// Indexes must strictly increase; gaps are allowed (after a purge).
    pub fn append(
        &mut self,
        raft_index: u64,
        record_count: u32,
    ) -> Result<Range<i64>, TranslateError> {
        if let Some(last) = self.last_index {
            if raft_index <= last {
                return Err(TranslateError::IndexNotIncreasing {
                    index: raft_index,
                    last,
                });
            }
        }
        self.last_index = Some(raft_index);
        let base = self.next_offset();
        if record_count == 0 {
            return Ok(base..base);
        }
        let row = DataEntry {
            raft_index,
            base_offset: base,
            record_count,
        };
        self.rows.push(row);
        Ok(row.offsets())
    }

    /// Removes every entry at or above `raft_index` (a diverged, uncommitted tail). Their
    /// offsets become free again.
    pub fn truncate_from(&mut self, raft_index: u64) {
        let keep = self.rows.partition_point(|r| r.raft_index < raft_index);
        self.rows.truncate(keep);
        self.last_index = match self.last_index {
            Some(last) if last >= raft_index => raft_index.checked_sub(1),
            other => other,
        };
    }

    /// The offset the next data entry will take: the log end offset.
    pub fn next_offset(&self) -> i64 {
        self.rows
            .last()
            .map_or(self.log_start_offset, |r| r.offsets().end)
    }

    /// The last raft index recorded, if any.
    pub fn last_index(&self) -> Option<u64> {
        self.last_index
    }

    /// The Kafka offsets taken by the entry at `raft_index`: `None` if that index holds no
    /// records (blank, membership, or not in the log).
    pub fn offsets_of(&self, raft_index: u64) -> Option<Range<i64>> {
        let at = self.rows.partition_point(|r| r.raft_index < raft_index);
        self.rows
            .get(at)
            .filter(|r| r.raft_index == raft_index)
            .map(DataEntry::offsets)
    }

    /// The Kafka offset after every record at or below `raft_index`. With the commit index this
    /// is the high watermark; with `None` (nothing committed) it is the log start offset.
    pub fn next_offset_through(&self, raft_index: Option<u64>) -> i64 {
        let Some(index) = raft_index else {
            return self.log_start_offset;
        };
        let upto = self.rows.partition_point(|r| r.raft_index <= index);
        match upto.checked_sub(1).and_then(|i| self.rows.get(i)) {
            Some(r) => r.offsets().end,
            None => self.log_start_offset,
        }
    }

    /// The data entry whose records include `offset`, if one does.
    pub fn entry_for_offset(&self, offset: i64) -> Option<DataEntry> {
        let at = self.rows.partition_point(|r| r.offsets().end <= offset);
        self.rows
            .get(at)
            .copied()
            .filter(|r| r.offsets().contains(&offset))
    }

    /// Data entries with a raft index in `from..` (in order), for reads.
    pub fn data_entries_from_offset(&self, offset: i64) -> &[DataEntry] {
        let at = self.rows.partition_point(|r| r.offsets().end <= offset);
        self.rows.get(at..).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn worked_example_from_the_docs() {
        // index 1: membership (initialize), 2: blank (leader of term 1),
        // 3: 5 records, 4: 1 record, 5: blank (new leader, term 2), 6: 3 records.
        let mut t = OffsetTranslator::new();
        assert_eq!(t.append(1, 0).unwrap(), 0..0);
        assert_eq!(t.append(2, 0).unwrap(), 0..0);
        assert_eq!(t.append(3, 5).unwrap(), 0..5);
        assert_eq!(t.append(4, 1).unwrap(), 5..6);
        assert_eq!(t.append(5, 0).unwrap(), 6..6);
        assert_eq!(t.append(6, 3).unwrap(), 6..9);
        assert_eq!(t.offsets_of(3), Some(0..5));
        assert_eq!(t.offsets_of(5), None);
        assert_eq!(t.next_offset_through(None), 0);
        assert_eq!(t.next_offset_through(Some(2)), 0);
        assert_eq!(t.next_offset_through(Some(3)), 5);
        assert_eq!(t.next_offset_through(Some(5)), 6);
        assert_eq!(t.next_offset_through(Some(100)), 9);
        assert_eq!(t.entry_for_offset(7).map(|e| e.raft_index), Some(6));
        assert_eq!(t.entry_for_offset(9), None);
        // A diverged follower drops indexes 5.. and the new leader's entries reuse offset 6.
        t.truncate_from(5);
        assert_eq!(t.next_offset(), 6);
        assert_eq!(t.last_index(), Some(4));
        assert_eq!(t.append(5, 0).unwrap(), 6..6);
        assert_eq!(t.append(6, 2).unwrap(), 6..8);
    }

    #[test]
    fn indexes_must_increase() {
        let mut t = OffsetTranslator::new();
        t.append(3, 1).unwrap();
        assert_eq!(
            t.append(3, 1),
            Err(TranslateError::IndexNotIncreasing { index: 3, last: 3 })
        );
        t.truncate_from(0);
        assert_eq!(t.last_index(), None);
        assert_eq!(t.append(1, 2).unwrap(), 0..2);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Entry(u32),
        Truncate(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..5).prop_map(Op::Entry),
            1 => (0u64..40).prop_map(Op::Truncate),
        ]
    }

    /// Naive model: the record count at every raft index 1..=n, recomputed from scratch.
    fn model_offsets(counts: &[u32], index: u64) -> (i64, i64) {
        let before: i64 = counts
            .iter()
            .take(index as usize - 1)
            .map(|&c| i64::from(c))
            .sum();
        (before, before + i64::from(counts[index as usize - 1]))
    }

    proptest! {
        /// Against a naive model: every query agrees after any sequence of appends and
        /// truncations, and a rebuild from the surviving entries gives the same translator
        /// (restart).
        #[test]
        fn matches_naive_model(ops in proptest::collection::vec(op(), 0..80)) {
            let mut t = OffsetTranslator::new();
            let mut counts: Vec<u32> = Vec::new(); // counts[i - 1] = records at raft index i
            for op in ops {
                match op {
                    Op::Entry(n) => {
                        let index = counts.len() as u64 + 1;
                        counts.push(n);
                        let (b, e) = model_offsets(&counts, index);
                        prop_assert_eq!(t.append(index, n).unwrap(), b..e);
                    }
                    Op::Truncate(i) => {
                        let i = i.max(1);
                        counts.truncate(i as usize - 1);
                        t.truncate_from(i);
                    }
                }
                let total: i64 = counts.iter().map(|&c| i64::from(c)).sum();
                prop_assert_eq!(t.next_offset(), total);
                prop_assert_eq!(t.next_offset_through(None), 0);
                for index in 1..=counts.len() as u64 {
                    let (b, e) = model_offsets(&counts, index);
                    let expect = if b == e { None } else { Some(b..e) };
                    prop_assert_eq!(t.offsets_of(index), expect);
                    prop_assert_eq!(t.next_offset_through(Some(index)), e);
                    for offset in b..e {
                        prop_assert_eq!(t.entry_for_offset(offset).map(|d| d.raft_index), Some(index));
                    }
                }
                prop_assert_eq!(t.entry_for_offset(total), None);
                // Restart: rebuilt by replaying the surviving log.
                let mut rebuilt = OffsetTranslator::new();
                for (i, &n) in counts.iter().enumerate() {
                    rebuilt.append(i as u64 + 1, n).unwrap();
                }
                prop_assert_eq!(&rebuilt.rows, &t.rows);
                prop_assert_eq!(rebuilt.next_offset(), t.next_offset());
            }
        }

        /// The high watermark never decreases as the commit index grows, and never passes the
        /// log end offset.
        #[test]
        fn high_watermark_monotonic(counts in proptest::collection::vec(0u32..4, 1..60)) {
            let mut t = OffsetTranslator::new();
            for (i, &n) in counts.iter().enumerate() {
                t.append(i as u64 + 1, n).unwrap();
            }
            let mut prev = t.next_offset_through(None);
            for commit in 1..=counts.len() as u64 {
                let hw = t.next_offset_through(Some(commit));
                prop_assert!(hw >= prev);
                prop_assert!(hw <= t.next_offset());
                prev = hw;
            }
            prop_assert_eq!(prev, t.next_offset());
        }
    }
}
