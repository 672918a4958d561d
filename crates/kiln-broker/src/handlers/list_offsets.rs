//! ListOffsets, answered by the partition's leader: earliest is the log start (retention moves
//! it), latest the high watermark, a timestamp the first record at or after it. A leader whose
//! term has not committed an entry yet answers OFFSET_NOT_AVAILABLE where its high watermark
//! would matter.

use std::sync::Arc;

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;
use kiln_log::BatchHeader;
use kiln_raft::{PartitionError, ReplicatedPartition};

use crate::cluster::Cluster;
use crate::errors::partition_error_code;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
/// Attributes bits 0-2: the compression codec; 0 is none.
const COMPRESSION_MASK: i16 = 0b111;

pub fn handle(cluster: &Arc<Cluster>, request: ListOffsetsRequest) -> ListOffsetsResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|wanted| {
            let topic = cluster.topic(wanted.name.as_str());
            let partitions = wanted
                .partitions
                .iter()
                .map(|p| {
                    let response = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_timestamp(-1)
                        .with_offset(-1);
                    let Some(topic) = topic.as_ref().filter(|t| {
                        p.partition_index >= 0 && p.partition_index < t.partition_count()
                    }) else {
                        return response
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    };
                    let Some(replica) = cluster
                        .partition(topic, p.partition_index)
                        .filter(|r| r.is_leader())
                    else {
                        return response.with_error_code(ResponseError::NotLeaderOrFollower.code());
                    };
                    let current = replica.partition.high_watermark_is_current();
                    match lookup(&replica.partition, p.timestamp) {
                        Ok(found) if !answerable(current, p.timestamp, found.is_some()) => {
                            response.with_error_code(ResponseError::OffsetNotAvailable.code())
                        }
                        Ok(Some((offset, timestamp))) => {
                            response.with_offset(offset).with_timestamp(timestamp)
                        }
                        Ok(None) => response,
                        Err(e) => {
                            tracing::warn!(topic = %wanted.name.as_str(), partition = p.partition_index, error = %e, "offset lookup failed");
                            response.with_error_code(partition_error_code(&e).code())
                        }
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(wanted.name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// Whether a query is answered with what was found. A new leader's high watermark may trail
/// what its predecessor acknowledged (`high_watermark_is_current`): answered from it, the log
/// end would seem to go backwards. Kafka answers OFFSET_NOT_AVAILABLE (retriable) meanwhile, for
/// LATEST and for a timestamp found nowhere below the high watermark.
fn answerable(high_watermark_is_current: bool, timestamp: i64, found: bool) -> bool {
    high_watermark_is_current || !(timestamp == LATEST || (timestamp >= 0 && !found))
}

/// (offset, timestamp) for a ListOffsets query; timestamp -1 for the special queries.
fn lookup(
    partition: &ReplicatedPartition,
    timestamp: i64,
) -> Result<Option<(i64, i64)>, PartitionError> {
    let high_watermark = partition.high_watermark();
    match timestamp {
        EARLIEST => Ok(Some((partition.log_start_offset(), -1))),
        LATEST => Ok(Some((high_watermark, -1))),
        ts if ts >= 0 => {
            let Some(found) = partition.lookup_timestamp(ts)? else {
                return Ok(None);
            };
            if found.batch_base_offset >= high_watermark {
                return Ok(None);
            }
            Ok(Some(
                first_record_at_or_after(partition, found.batch_base_offset, ts, high_watermark)?
                    .unwrap_or((found.batch_base_offset, found.batch_max_timestamp)),
            ))
        }
        // Other negative values (e.g. -3, max timestamp) are not served.
        _ => Ok(None),
    }
}

/// Refines a batch-level hit to the exact record for uncompressed batches. Compressed batches
/// answer with their first offset: decompressing on this path would let one producer's batch
/// make the broker allocate without bound.
fn first_record_at_or_after(
    partition: &ReplicatedPartition,
    batch_base_offset: i64,
    ts: i64,
    high_watermark: i64,
) -> Result<Option<(i64, i64)>, PartitionError> {
    let read = partition.read(batch_base_offset, 1)?;
    let Ok(header) = BatchHeader::parse(&read.records) else {
        return Ok(None);
    };
    if header.attributes & COMPRESSION_MASK != 0 {
        return Ok(None);
    }
    let mut bytes = read
        .records
        .slice(..header.total_len().min(read.records.len()));
    let Ok(set) = RecordBatchDecoder::decode(&mut bytes) else {
        return Ok(None);
    };
    Ok(set
        .records
        .iter()
        .find(|r| r.timestamp >= ts && r.offset < high_watermark)
        .map(|r| (r.offset, r.timestamp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_whose_term_has_not_committed_answers_only_what_cannot_go_backwards() {
        for timestamp in [LATEST, EARLIEST, 0, 1_700_000_000_000, -3] {
            for found in [false, true] {
                assert!(answerable(true, timestamp, found));
            }
        }
        assert!(!answerable(false, LATEST, true));
        assert!(!answerable(false, 1_700_000_000_000, false));
        // Found below the high watermark: a later one can only be later.
        assert!(answerable(false, 1_700_000_000_000, true));
        // The log start does not depend on the high watermark.
        assert!(answerable(false, EARLIEST, true));
        // Not served at all (the answer says -1 whoever leads).
        assert!(answerable(false, -3, false));
    }
}
