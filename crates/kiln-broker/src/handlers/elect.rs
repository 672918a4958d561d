//! ElectLeaders (KIP-460): each named partition's leadership moves to its preferred replica
//! (`cluster/elect.rs`); any broker takes the request. A null partition list means every
//! partition of every topic, and then, as in Kafka, partitions that needed no election are
//! left out of the answer. Kiln has no unclean election: a Raft group elects only a replica a
//! majority holds everything committed on, so UNCLEAN is refused per partition.

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::elect::Election;
use crate::cluster::Cluster;
use crate::handlers::Reply;

/// ElectLeaders' election types (v1+; v0 always means preferred).
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;
/// The wait when the request gives none (Kafka's admin clients send 60 s).
const WAIT_DEFAULT: Duration = Duration::from_secs(30);
/// Partitions one request may name (each is a handover of about a second, a few at once).
pub const ELECTIONS_PER_REQUEST_MAX: usize = 10_000;

pub fn elect_leaders(cluster: &Arc<Cluster>, request: ElectLeadersRequest, version: i16) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let every = request.topic_partitions.is_none();
        let wanted: Vec<(String, i32)> = match &request.topic_partitions {
            Some(topics) => topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| (t.topic.to_string(), *p)))
                .collect(),
            None => {
                let mut topics = cluster.topics();
                topics.sort_by(|a, b| a.name.cmp(&b.name));
                topics
                    .iter()
                    .flat_map(|t| (0..t.partition_count()).map(|p| (t.name.clone(), p)))
                    .collect()
            }
        };
        let election_type = if version == 0 {
            PREFERRED
        } else {
            request.election_type
        };
        let refusal = if election_type == UNCLEAN {
            Some(
                "Kiln never elects an out-of-sync replica: a partition's Raft group elects only \
                 a replica that holds every committed record"
                    .to_string(),
            )
        } else if election_type != PREFERRED {
            Some(format!(
                "election type {election_type} is not one Kafka defines (0 preferred, 1 unclean)"
            ))
        } else if wanted.len() > ELECTIONS_PER_REQUEST_MAX {
            Some(format!(
                "{} partitions named; at most {ELECTIONS_PER_REQUEST_MAX} per request",
                wanted.len()
            ))
        } else {
            None
        };
        let outcomes: Vec<(i16, Option<String>)> = match &refusal {
            Some(why) => {
                tracing::info!(election_type, partitions = wanted.len(), %why, "leader election refused");
                wanted
                    .iter()
                    .map(|_| (ResponseError::InvalidRequest.code(), Some(why.clone())))
                    .collect()
            }
            None => {
                let wait = u64::try_from(request.timeout_ms)
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map_or(WAIT_DEFAULT, Duration::from_millis);
                let elections = cluster.elect_preferred(&wanted, wait).await;
                let elected = elections
                    .iter()
                    .filter(|e| **e == Election::Elected)
                    .count();
                tracing::info!(
                    partitions = wanted.len(),
                    elected,
                    "preferred leader election on request"
                );
                elections.into_iter().map(code).collect()
            }
        };
        let mut results: Vec<ReplicaElectionResult> = Vec::new();
        for ((topic, partition), (error, message)) in wanted.into_iter().zip(outcomes) {
            if every && error == ResponseError::ElectionNotNeeded.code() {
                continue;
            }
            let result = PartitionResult::default()
                .with_partition_id(partition)
                .with_error_code(error)
                .with_error_message(message.map(StrBytes::from_string));
            match results.last_mut() {
                Some(last) if last.topic.as_str() == topic => last.partition_result.push(result),
                _ => results.push(
                    ReplicaElectionResult::default()
                        .with_topic(StrBytes::from_string(topic).into())
                        .with_partition_result(vec![result]),
                ),
            }
        }
        ResponseKind::ElectLeaders(
            ElectLeadersResponse::default().with_replica_election_results(results),
        )
    }))
}

/// The answer to a request refused as a whole: `error` on the request (v1+; v0 has no field
/// for it) and on every partition it names.
pub fn refuse(
    request: &ElectLeadersRequest,
    version: i16,
    error: ResponseError,
    why: &str,
) -> ResponseKind {
    let results = request
        .topic_partitions
        .iter()
        .flatten()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    PartitionResult::default()
                        .with_partition_id(*p)
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_string(why.to_string())))
                })
                .collect();
            ReplicaElectionResult::default()
                .with_topic(t.topic.clone())
                .with_partition_result(partitions)
        })
        .collect();
    let top = if version >= 1 { error.code() } else { 0 };
    ResponseKind::ElectLeaders(
        ElectLeadersResponse::default()
            .with_error_code(top)
            .with_replica_election_results(results),
    )
}

/// An election's error code and message (success has neither).
fn code(election: Election) -> (i16, Option<String>) {
    let (error, why) = match election {
        Election::Elected => return (0, None),
        Election::NotNeeded => (ResponseError::ElectionNotNeeded, None),
        Election::UnknownPartition => (ResponseError::UnknownTopicOrPartition, None),
        Election::NoLeader(why) => (ResponseError::LeaderNotAvailable, Some(why)),
        Election::PreferredNotReady(why) | Election::HandoverFailed(why) => {
            (ResponseError::PreferredLeaderNotAvailable, Some(why))
        }
        Election::TimedOut(why) => (ResponseError::RequestTimedOut, Some(why)),
    };
    (error.code(), why)
}
