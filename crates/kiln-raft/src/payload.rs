//! What a Raft entry of a Kiln group carries (openraft's application data, `D`).
//!
//! A producer's records, or a command the replicas apply. On disk a data entry is its batches
//! and a command one control batch of kind [`kiln_log::ControlKind::Command`] (kiln-log, "Entries");
//! openraft's own blank and membership entries are control batches too.

use bytes::Bytes;
use kiln_log::ProducerBatch;

use crate::record::Reader;

/// The payload of a normal (non-blank, non-membership) entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// One or more RecordBatch v2, validated. `kafka_offset` is `None` for a producer's new
    /// append (the log stamps offsets) and the offset of the first record for an entry read
    /// back from a log (its batches are stamped; a follower checks that its own log agrees).
    Records {
        batches: Bytes,
        record_count: u32,
        kafka_offset: Option<i64>,
    },
    /// A data entry without its bytes: what the Raft core of a data partition reads back to
    /// apply (it counts records and follows idempotent producers), so applying never reads
    /// record bytes from disk. `producers`: the batches with a producer id, in order, with
    /// their Kafka offsets.
    Summary {
        record_count: u32,
        kafka_offset: i64,
        producers: Vec<ProducerBatch>,
    },
    /// A request every replica applies at this point of the log.
    Command(Command),
    /// Records the leader's proposer wrote into its log before handing the entry to Raft
    /// (`LogStore::write_ahead`): `batches` as stored (stamped). The log store adopts the entry
    /// in place when Raft appends it at the index and term it was written at with the same
    /// `token`, and otherwise writes `batches` again, stamped where they land. Only ever
    /// between the proposer and its own log store: never sent, never read back.
    WrittenAhead {
        batches: Bytes,
        record_count: u32,
        token: u64,
    },
}

/// Commands every replica of a group applies in log order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Retention: the log now starts at Kafka offset `kafka_offset`; the entries up to `index`
    /// (written in `term`) may go, whole segments at a time.
    LogStart {
        index: u64,
        term: u64,
        kafka_offset: i64,
    },
    /// DeleteRecords: clients read from Kafka offset `kafka_offset` on, which may lie inside an
    /// entry. Nothing is purged by this command: the whole segments below it go by a later
    /// [`Command::LogStart`] (retention's timer proposes one), whose offsets are entry
    /// boundaries as snapshots need.
    DeleteRecords { kafka_offset: i64 },
}

const COMMAND_LOG_START: u8 = 1;
const COMMAND_DELETE_RECORDS: u8 = 2;

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(32);
        match self {
            Command::LogStart {
                index,
                term,
                kafka_offset,
            } => {
                p.push(COMMAND_LOG_START);
                p.extend_from_slice(&index.to_be_bytes());
                p.extend_from_slice(&term.to_be_bytes());
                p.extend_from_slice(&kafka_offset.to_be_bytes());
            }
            Command::DeleteRecords { kafka_offset } => {
                p.push(COMMAND_DELETE_RECORDS);
                p.extend_from_slice(&kafka_offset.to_be_bytes());
            }
        }
        p
    }

    /// `None` for an unknown or malformed command.
    pub fn decode(payload: &[u8]) -> Option<Command> {
        let mut r = Reader::new(payload);
        let command = match r.u8()? {
            COMMAND_LOG_START => Command::LogStart {
                index: r.u64()?,
                term: r.u64()?,
                kafka_offset: r.i64()?,
            },
            COMMAND_DELETE_RECORDS => Command::DeleteRecords {
                kafka_offset: r.i64()?,
            },
            _ => return None,
        };
        r.done().then_some(command)
    }
}

impl Payload {
    /// A producer's append: `batches` must already be validated.
    pub fn records(batches: Bytes, record_count: u32) -> Payload {
        Payload::Records {
            batches,
            record_count,
            kafka_offset: None,
        }
    }

    /// The Kafka offsets the entry takes.
    /// The batches with a producer id of an entry's records at Kafka offset `kafka_offset`,
    /// each with its own offset (stored batches carry a check in their base offset field, so
    /// offsets are counted from the entry's instead).
    pub fn producer_batches(batches: &Bytes, kafka_offset: i64) -> Vec<ProducerBatch> {
        let mut out = Vec::new();
        let mut offset = kafka_offset;
        for b in kiln_log::batch::batches(batches) {
            let Ok(b) = b else {
                // Validated before it was written or when it was read: cannot happen.
                debug_assert!(false, "an entry's batches do not parse");
                break;
            };
            let mut h = b.header;
            h.base_offset = offset;
            out.extend(h.producer_batch());
            offset += i64::from(h.record_count.max(0));
        }
        out
    }

    pub fn record_count(&self) -> u32 {
        match self {
            Payload::Records { record_count, .. }
            | Payload::Summary { record_count, .. }
            | Payload::WrittenAhead { record_count, .. } => *record_count,
            Payload::Command(_) => 0,
        }
    }

    /// Bytes this payload holds in memory (for cache bounds).
    pub fn bytes_len(&self) -> usize {
        match self {
            Payload::Records { batches, .. } | Payload::WrittenAhead { batches, .. } => {
                batches.len()
            }
            _ => 32,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn commands_round_trip_and_garbage_is_refused() {
        let c = Command::LogStart {
            index: 9,
            term: 2,
            kafka_offset: 1234,
        };
        assert_eq!(Command::decode(&c.encode()), Some(c));
        let bytes = c.encode();
        for cut in 0..bytes.len() {
            assert_eq!(Command::decode(&bytes[..cut]), None);
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Command::decode(&long), None);
        assert_eq!(Command::decode(&[9]), None);
        let d = Command::DeleteRecords { kafka_offset: 77 };
        assert_eq!(Command::decode(&d.encode()), Some(d));
    }
}
