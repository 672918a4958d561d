//! The idempotent producers of one data partition: for every producer id, its epoch and its
//! last [`BATCHES_KEPT`] batches (sequence range and offsets), as Kafka keeps them.
//!
//! Two copies exist. Every replica's state machine applies committed batches to its
//! [`ProducerTable`] in log order (so it is the same on every replica, and kept in the `state`
//! file and in snapshots). The leader's proposer keeps a second one, the table as of its log
//! end: rebuilt from the applied one when a term starts (once everything before the term is
//! applied) and updated as it accepts batches, so a retry is recognised even while the batch
//! it repeats is still being replicated (`proposer.rs`).
//!
//! The rules ([`ProducerTable::check`]), Kafka's (`ProducerAppendInfo`):
//! * an unknown producer id (never seen here, expired or evicted): its batch must start at
//!   sequence 0, else [`Verdict::UnknownProducer`] (Kafka: UNKNOWN_PRODUCER_ID). The
//!   producer's earlier batches may or may not be in the log, so a later sequence can be
//!   neither checked nor accepted safely: accepting it would write a retry twice, or leave a
//!   gap. Clients answer it by taking a new producer id or epoch (KIP-360) and resending from
//!   sequence 0. (Kafka 2.5 to 4.x accepts any sequence here, a hole KAFKA-19880 closes;
//!   Kafka before 2.5 refused as this does.) Retention does not forget producers: the table is
//!   kept in the `state` file and snapshots, not rebuilt from what the log still holds;
//! * an epoch below the producer's: [`Verdict::InvalidEpoch`];
//! * a new, higher epoch: its first batch must start at sequence 0;
//! * the same epoch: a batch equal (first and last sequence) to one of the kept ones is a
//!   [`Verdict::Duplicate`], answered with that batch's offsets; otherwise it must start right
//!   after the last one (sequences wrap from `i32::MAX` to 0), else [`Verdict::OutOfOrder`].
//!
//! Bounds: [`BATCHES_KEPT`] batches per producer; at most [`PRODUCERS_MAX`] producers per
//! partition (beyond it the one that wrote least recently is forgotten); a producer that has
//! written nothing for [`EXPIRATION_MS`] of log time (record timestamps) is forgotten
//! (Kafka's `producer.id.expiration.ms`). An entry takes at most about 280 bytes, so a
//! partition's table at most about 2.8 MB. Expiry and eviction depend only on the log, so
//! every replica forgets the same producers at the same point.
//!
//! Applying is idempotent: a batch at or below the producer's last recorded offset is skipped,
//! so a table restored from a snapshot may be handed entries it already holds.

use std::collections::{HashMap, VecDeque};

use kiln_log::ProducerBatch;

use crate::record::Reader;

/// Batches remembered per producer (Kafka: 5, the most a producer may have in flight).
pub const BATCHES_KEPT: usize = 5;
/// Producers remembered per partition.
pub const PRODUCERS_MAX: usize = 10_000;
/// A producer silent this long (ms of record time) is forgotten (Kafka's default, 1 day).
pub const EXPIRATION_MS: i64 = 86_400_000;
/// Expired producers are looked for each time the log passes a multiple of this many offsets.
const EXPIRY_EVERY_OFFSETS: i64 = 1024;

const MAGIC: u8 = 1;

/// One producer's state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProducerEntry {
    epoch: i16,
    /// The last batches, oldest first, all of `epoch`.
    batches: VecDeque<ProducerBatch>,
    /// The largest record timestamp it wrote (expiry).
    last_timestamp: i64,
}

impl ProducerEntry {
    fn last(&self) -> Option<&ProducerBatch> {
        self.batches.back()
    }
}

/// What the leader does with a producer's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// New and in sequence: append it.
    Append,
    /// Already written (a retry): answer with these offsets, write nothing.
    Duplicate { base_offset: i64, last_offset: i64 },
    /// A gap or a repeat that is not one of the kept batches.
    OutOfOrder { expected: i32, got: i32 },
    /// The producer has moved to a newer epoch (a fenced, older instance).
    InvalidEpoch { current: i16, got: i16 },
    /// No state for this producer and a batch that does not start at sequence 0.
    UnknownProducer { got: i32 },
}

/// See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerTable {
    entries: HashMap<i64, ProducerEntry>,
}

/// The sequence after `seq`, wrapping as Kafka does.
fn next_sequence(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

/// Whether `got` lies ahead of `expected` in sequence space (a gap, not a repeat): less than
/// half the sequence range on, counting across the wrap from `i32::MAX` to 0.
pub fn sequence_ahead(expected: i32, got: i32) -> bool {
    let range = i64::from(i32::MAX) + 1;
    let distance = (i64::from(got) - i64::from(expected)).rem_euclid(range);
    distance > 0 && distance < range / 2
}

impl ProducerTable {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A table of only the producers in `ids` (what the leader stages one request's batches
    /// on before it accepts them).
    pub fn subset(&self, ids: &std::collections::BTreeSet<i64>) -> ProducerTable {
        ProducerTable {
            entries: ids
                .iter()
                .filter_map(|id| self.entries.get(id).map(|e| (*id, e.clone())))
                .collect(),
        }
    }

    /// The epoch this table holds for `producer_id`, if it knows the producer.
    pub fn epoch(&self, producer_id: i64) -> Option<i16> {
        self.entries.get(&producer_id).map(|e| e.epoch)
    }

    /// What the leader does with `batch` (see the module docs). `batch.base_offset` is not
    /// looked at.
    pub fn check(&self, batch: &ProducerBatch) -> Verdict {
        let Some(entry) = self.entries.get(&batch.producer_id) else {
            return if batch.base_sequence == 0 {
                Verdict::Append
            } else {
                Verdict::UnknownProducer {
                    got: batch.base_sequence,
                }
            };
        };
        if batch.producer_epoch < entry.epoch {
            return Verdict::InvalidEpoch {
                current: entry.epoch,
                got: batch.producer_epoch,
            };
        }
        if batch.producer_epoch > entry.epoch {
            return if batch.base_sequence == 0 {
                Verdict::Append
            } else {
                Verdict::OutOfOrder {
                    expected: 0,
                    got: batch.base_sequence,
                }
            };
        }
        let last_sequence = batch.last_sequence();
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.base_sequence == batch.base_sequence && b.last_sequence() == last_sequence)
        {
            return Verdict::Duplicate {
                base_offset: dup.base_offset,
                last_offset: dup.last_offset(),
            };
        }
        match entry.last() {
            Some(last) if next_sequence(last.last_sequence()) != batch.base_sequence => {
                Verdict::OutOfOrder {
                    expected: next_sequence(last.last_sequence()),
                    got: batch.base_sequence,
                }
            }
            _ => Verdict::Append,
        }
    }

    /// Records `batch`, written at `batch.base_offset` (see the module docs: idempotent, and
    /// expiry and eviction follow the log).
    pub fn apply(&mut self, batch: ProducerBatch) {
        let entry = self
            .entries
            .entry(batch.producer_id)
            .or_insert_with(|| ProducerEntry {
                epoch: batch.producer_epoch,
                batches: VecDeque::with_capacity(BATCHES_KEPT),
                last_timestamp: i64::MIN,
            });
        if entry
            .last()
            .is_some_and(|l| batch.base_offset <= l.base_offset)
        {
            return;
        }
        if batch.producer_epoch != entry.epoch {
            entry.epoch = batch.producer_epoch;
            entry.batches.clear();
        }
        if entry.batches.len() == BATCHES_KEPT {
            entry.batches.pop_front();
        }
        entry.batches.push_back(batch);
        entry.last_timestamp = entry.last_timestamp.max(batch.max_timestamp);
        debug_assert!(entry.batches.len() <= BATCHES_KEPT);
        let passed_mark = batch.base_offset.div_euclid(EXPIRY_EVERY_OFFSETS)
            != batch
                .last_offset()
                .saturating_add(1)
                .div_euclid(EXPIRY_EVERY_OFFSETS);
        if passed_mark {
            self.expire(batch.max_timestamp);
        }
        if self.entries.len() > PRODUCERS_MAX {
            self.evict_least_recent();
        }
        debug_assert!(self.entries.len() <= PRODUCERS_MAX);
    }

    /// Forgets producers silent for [`EXPIRATION_MS`] before `now` (log time).
    fn expire(&mut self, now: i64) {
        let horizon = now.saturating_sub(EXPIRATION_MS);
        self.entries.retain(|_, e| e.last_timestamp >= horizon);
    }

    fn evict_least_recent(&mut self) {
        let oldest = self
            .entries
            .iter()
            .min_by_key(|(id, e)| (e.last().map_or(i64::MIN, |b| b.base_offset), **id))
            .map(|(id, _)| *id);
        if let Some(id) = oldest {
            self.entries.remove(&id);
        }
    }

    /// `magic u8, count u32, count × [producer id i64, epoch i16, last timestamp i64, n u8,
    /// n × (base sequence i32, last offset delta i32, base offset i64, max timestamp i64)]`,
    /// big-endian, producers in id order (equal tables encode equally).
    pub fn encode(&self) -> Vec<u8> {
        let mut ids: Vec<&i64> = self.entries.keys().collect();
        ids.sort_unstable();
        let mut p = Vec::with_capacity(5 + self.entries.len() * 64);
        p.push(MAGIC);
        p.extend_from_slice(&(ids.len() as u32).to_be_bytes());
        for id in ids {
            let e = &self.entries[id];
            p.extend_from_slice(&id.to_be_bytes());
            p.extend_from_slice(&e.epoch.to_be_bytes());
            p.extend_from_slice(&e.last_timestamp.to_be_bytes());
            p.push(e.batches.len() as u8);
            for b in &e.batches {
                p.extend_from_slice(&b.base_sequence.to_be_bytes());
                p.extend_from_slice(&b.last_offset_delta.to_be_bytes());
                p.extend_from_slice(&b.base_offset.to_be_bytes());
                p.extend_from_slice(&b.max_timestamp.to_be_bytes());
            }
        }
        p
    }

    /// The inverse of [`ProducerTable::encode`]; every count and length is checked.
    pub fn decode(bytes: &[u8]) -> Result<ProducerTable, String> {
        let mut r = Reader::new(bytes);
        let bad = |what: &str| format!("producer state: {what}");
        if r.u8().ok_or_else(|| bad("empty"))? != MAGIC {
            return Err(bad("unknown format"));
        }
        let count = r.u32().ok_or_else(|| bad("no count"))? as usize;
        if count > PRODUCERS_MAX {
            return Err(bad(&format!(
                "{count} producers, more than {PRODUCERS_MAX}"
            )));
        }
        let mut entries = HashMap::with_capacity(count);
        for _ in 0..count {
            let id = r.i64().ok_or_else(|| bad("truncated producer"))?;
            let epoch = r.i16().ok_or_else(|| bad("truncated producer"))?;
            let last_timestamp = r.i64().ok_or_else(|| bad("truncated producer"))?;
            let n = usize::from(r.u8().ok_or_else(|| bad("truncated producer"))?);
            if n == 0 || n > BATCHES_KEPT {
                return Err(bad(&format!("producer {id} with {n} batches")));
            }
            let mut batches = VecDeque::with_capacity(n);
            for _ in 0..n {
                let base_sequence = r.i32().ok_or_else(|| bad("truncated batch"))?;
                let last_offset_delta = r.i32().ok_or_else(|| bad("truncated batch"))?;
                let base_offset = r.i64().ok_or_else(|| bad("truncated batch"))?;
                let max_timestamp = r.i64().ok_or_else(|| bad("truncated batch"))?;
                if last_offset_delta < 0 || base_offset < 0 {
                    return Err(bad(&format!(
                        "producer {id}: a batch with negative offsets"
                    )));
                }
                batches.push_back(ProducerBatch {
                    producer_id: id,
                    producer_epoch: epoch,
                    base_sequence,
                    last_offset_delta,
                    base_offset,
                    max_timestamp,
                });
            }
            if entries
                .insert(
                    id,
                    ProducerEntry {
                        epoch,
                        batches,
                        last_timestamp,
                    },
                )
                .is_some()
            {
                return Err(bad(&format!("producer {id} twice")));
            }
        }
        if !r.done() {
            return Err(bad("bytes after the last producer"));
        }
        Ok(ProducerTable { entries })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn batch(pid: i64, epoch: i16, seq: i32, records: i32, offset: i64) -> ProducerBatch {
        ProducerBatch {
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            last_offset_delta: records - 1,
            base_offset: offset,
            max_timestamp: 1_000 + offset,
        }
    }

    #[test]
    fn kafka_rules_for_sequences_and_epochs() {
        let mut t = ProducerTable::default();
        // Unknown: only from sequence 0 (any epoch).
        assert_eq!(
            t.check(&batch(7, 0, 42, 3, 0)),
            Verdict::UnknownProducer { got: 42 }
        );
        assert_eq!(t.check(&batch(7, 4, 0, 3, 0)), Verdict::Append);
        assert_eq!(t.check(&batch(7, 0, 0, 3, 0)), Verdict::Append);
        t.apply(batch(7, 0, 0, 3, 0));
        // In sequence, a gap, a retry of a kept batch.
        assert_eq!(t.check(&batch(7, 0, 3, 2, 3)), Verdict::Append);
        assert_eq!(
            t.check(&batch(7, 0, 4, 1, 3)),
            Verdict::OutOfOrder {
                expected: 3,
                got: 4
            }
        );
        assert_eq!(
            t.check(&batch(7, 0, 0, 3, 99)),
            Verdict::Duplicate {
                base_offset: 0,
                last_offset: 2
            }
        );
        // A repeat that overlaps but is not a kept batch is out of order.
        assert_eq!(
            t.check(&batch(7, 0, 1, 2, 99)),
            Verdict::OutOfOrder {
                expected: 3,
                got: 1
            }
        );
        // Epochs: older refused, newer must start at 0.
        t.apply(batch(7, 2, 0, 1, 3));
        assert_eq!(
            t.check(&batch(7, 1, 1, 1, 4)),
            Verdict::InvalidEpoch { current: 2, got: 1 }
        );
        assert_eq!(
            t.check(&batch(7, 3, 5, 1, 4)),
            Verdict::OutOfOrder {
                expected: 0,
                got: 5
            }
        );
        assert_eq!(t.check(&batch(7, 3, 0, 1, 4)), Verdict::Append);
        // Only the last five batches are kept.
        for i in 0..6 {
            t.apply(batch(9, 0, i, 1, 10 + i64::from(i)));
        }
        assert!(matches!(
            t.check(&batch(9, 0, 1, 1, 0)),
            Verdict::Duplicate { .. }
        ));
        assert!(matches!(
            t.check(&batch(9, 0, 0, 1, 0)),
            Verdict::OutOfOrder { expected: 6, .. }
        ));
    }

    #[test]
    fn a_sequence_is_ahead_across_the_wrap_too() {
        assert!(sequence_ahead(3, 4));
        assert!(!sequence_ahead(3, 3));
        assert!(!sequence_ahead(3, 1));
        assert!(sequence_ahead(i32::MAX - 1, 2));
        assert!(!sequence_ahead(2, i32::MAX - 1));
    }

    #[test]
    fn sequences_wrap_at_i32_max() {
        let mut t = ProducerTable::default();
        t.apply(batch(1, 0, i32::MAX - 1, 2, 0));
        assert_eq!(t.entries[&1].batches[0].last_sequence(), i32::MAX);
        assert_eq!(t.check(&batch(1, 0, 0, 1, 2)), Verdict::Append);
        let wrapped = batch(1, 0, i32::MAX, 3, 2);
        assert_eq!(wrapped.last_sequence(), 1);
    }

    #[test]
    fn applying_again_changes_nothing_and_encoding_round_trips() {
        let mut t = ProducerTable::default();
        for i in 0..20 {
            t.apply(batch(i % 3, 0, (i / 3) as i32, 2, i * 2));
        }
        let before = t.clone();
        for i in 0..20 {
            t.apply(batch(i % 3, 0, (i / 3) as i32, 2, i * 2));
        }
        assert_eq!(t, before);
        let bytes = t.encode();
        assert_eq!(ProducerTable::decode(&bytes).unwrap(), t);
        assert_eq!(bytes, ProducerTable::decode(&bytes).unwrap().encode());
        for cut in 0..bytes.len() {
            assert!(
                ProducerTable::decode(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(ProducerTable::decode(&longer).is_err());
    }

    #[test]
    fn silent_producers_expire_and_the_table_is_bounded() {
        let mut t = ProducerTable::default();
        t.apply(batch(1, 0, 0, 1, 0));
        let mut late = batch(2, 0, 0, 1, EXPIRY_EVERY_OFFSETS - 1);
        late.max_timestamp = 1_000 + EXPIRATION_MS + 10;
        t.apply(late);
        assert!(!t.entries.contains_key(&1), "producer 1 expired");
        assert!(t.entries.contains_key(&2));
        assert_eq!(
            t.check(&batch(1, 0, 1, 1, EXPIRY_EVERY_OFFSETS)),
            Verdict::UnknownProducer { got: 1 },
            "an expired producer's next batch is refused, not taken on trust"
        );
        let mut t = ProducerTable::default();
        for i in 0..(PRODUCERS_MAX as i64 + 5) {
            let mut b = batch(i, 0, 0, 1, i);
            b.max_timestamp = 5;
            t.apply(b);
        }
        assert_eq!(t.len(), PRODUCERS_MAX);
        assert!(!t.entries.contains_key(&0), "the least recent went first");
    }
}
