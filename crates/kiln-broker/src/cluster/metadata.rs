//! The cluster metadata log: topic creations and deletions, one JSON record each, in the
//! replicated `__cluster_metadata` group. Like KRaft, the metadata is itself a Kafka-format log:
//! the controller (that group's leader) appends, every broker applies the committed records in
//! order, so every broker ends up with the same topics and the same replica assignments.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// The cluster's id, proposed once by the first controller; the first one applied wins.
    InitCluster {
        cluster_id: String,
    },
    CreateTopic {
        name: String,
        id: Uuid,
        overrides: BTreeMap<String, String>,
        /// Per partition, the broker ids holding a replica, the preferred leader first.
        assignments: Vec<Vec<i32>>,
    },
    DeleteTopic {
        name: String,
        id: Uuid,
    },
}

/// One RecordBatch v2 holding `command` as its only record.
pub fn encode(command: &Command, now_ms: i64) -> Result<Bytes, String> {
    let value = serde_json::to_vec(command).map_err(|e| e.to_string())?;
    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: now_ms,
        key: None,
        value: Some(Bytes::from(value)),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        std::iter::once(&record),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("encoding a metadata record: {e}"))?;
    Ok(buf.freeze())
}

/// Every record of one or more batches read from the metadata log, with its offset. A record
/// that does not parse is returned as an error (logged and skipped by the applier: the log is
/// written only by controllers, so this means a newer version wrote it).
pub fn decode(mut batches: Bytes) -> Vec<(i64, Result<Command, String>)> {
    let mut out = Vec::new();
    while !batches.is_empty() {
        match RecordBatchDecoder::decode(&mut batches) {
            Ok(set) => {
                for record in set.records {
                    let parsed = record
                        .value
                        .as_deref()
                        .ok_or_else(|| "metadata record without a value".to_string())
                        .and_then(|v| serde_json::from_slice(v).map_err(|e| e.to_string()));
                    out.push((record.offset, parsed));
                }
            }
            Err(e) => {
                out.push((-1, Err(format!("undecodable metadata batch: {e}"))));
                break;
            }
        }
    }
    out
}

/// Replica assignment: partition `p` goes to `rf` consecutive brokers starting at
/// `(p + rotation) % n` of the sorted ids, so replicas and preferred leaders are spread evenly
/// and successive topics start on different brokers.
pub fn assign(brokers: &[i32], partitions: u32, rf: usize, rotation: usize) -> Vec<Vec<i32>> {
    let mut ids = brokers.to_vec();
    ids.sort_unstable();
    let n = ids.len().max(1);
    (0..partitions as usize)
        .map(|p| {
            (0..rf.min(ids.len()))
                .map(|i| ids[(p + rotation + i) % n])
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_through_a_record_batch() {
        let create = Command::CreateTopic {
            name: "orders".into(),
            id: Uuid::new_v4(),
            overrides: [("retention.ms".to_string(), "1000".to_string())].into(),
            assignments: vec![vec![1, 2, 3], vec![2, 3, 1]],
        };
        let delete = Command::DeleteTopic {
            name: "orders".into(),
            id: Uuid::new_v4(),
        };
        let mut joined = BytesMut::new();
        joined.extend_from_slice(&encode(&create, 1).expect("encode"));
        joined.extend_from_slice(&encode(&delete, 2).expect("encode"));
        let decoded = decode(joined.freeze());
        assert_eq!(decoded.len(), 2);
        assert_eq!(decoded[0].1.as_ref().ok(), Some(&create));
        assert_eq!(decoded[1].1.as_ref().ok(), Some(&delete));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let decoded = decode(Bytes::from_static(b"not a record batch at all, clearly"));
        assert!(decoded.iter().all(|(_, r)| r.is_err()), "{decoded:?}");
    }

    #[test]
    fn assignment_spreads_replicas_and_leaders() {
        let a = assign(&[3, 1, 2], 6, 3, 0);
        assert_eq!(a[0], vec![1, 2, 3]);
        assert_eq!(a[1], vec![2, 3, 1]);
        assert_eq!(a[2], vec![3, 1, 2]);
        for id in [1, 2, 3] {
            assert_eq!(
                a.iter().filter(|r| r[0] == id).count(),
                2,
                "leaders of {id}"
            );
        }
        let b = assign(&[1, 2, 3], 2, 2, 1);
        assert_eq!(b, vec![vec![2, 3], vec![3, 1]]);
        assert_eq!(assign(&[1, 2, 3], 1, 5, 0), vec![vec![1, 2, 3]]);
    }
}
