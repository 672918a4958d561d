//! Authorization of every request, before its handler runs (`[authorization]`; without it
//! [`check`] passes every request through untouched).
//!
//! Each API asks Kafka's question (KIP-11; the table in docs/security.md): WRITE on a topic to
//! produce, READ on a group and its topics to commit, DESCRIBE on the cluster for
//! DescribeCluster, and so on. A request naming several resources is split: the refused ones
//! are taken out before the handler sees the request (nothing is written, created or deleted
//! for them) and a [`Patch`] adds their error entries (TOPIC_AUTHORIZATION_FAILED,
//! GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED) to the handler's response. A
//! request with nothing left is answered at once. Listings (Metadata for all topics,
//! ListGroups, OffsetFetch of every topic) leave out what the principal may not describe, so
//! a topic's existence is not disclosed to someone who may not see it.

mod groups;
mod topics;

use kafka_protocol::messages::{RequestKind, ResponseKind};
use kafka_protocol::ResponseError;
use kiln_acl::Operation;

use crate::authorizer::Access;

/// Adds the refused resources' entries to the handler's response.
pub type Patch = Box<dyn FnOnce(ResponseKind) -> ResponseKind + Send>;

pub enum Checked {
    /// Serve this (possibly reduced) request, then apply the patch to its response.
    Serve(RequestKind, Option<Patch>),
    /// Everything the request names is refused: this is the whole answer.
    Answer(ResponseKind),
}

const TOPIC_DENIED: ResponseError = ResponseError::TopicAuthorizationFailed;
const GROUP_DENIED: ResponseError = ResponseError::GroupAuthorizationFailed;
const CLUSTER_DENIED: ResponseError = ResponseError::ClusterAuthorizationFailed;

pub fn check(access: &Access, version: i16, body: RequestKind) -> Checked {
    if !access.enforced() {
        return Checked::Serve(body, None);
    }
    match body {
        RequestKind::Produce(r) => topics::produce(access, r),
        RequestKind::Fetch(r) => topics::fetch(access, r),
        RequestKind::ListOffsets(r) => topics::list_offsets(access, r),
        RequestKind::Metadata(r) => topics::metadata(access, r),
        RequestKind::CreateTopics(r) => topics::create_topics(access, r),
        RequestKind::DeleteTopics(r) => topics::delete_topics(access, r),
        RequestKind::CreatePartitions(r) => topics::create_partitions(access, r),
        RequestKind::DeleteRecords(r) => topics::delete_records(access, r),
        RequestKind::DescribeConfigs(r) => topics::describe_configs(access, r),
        RequestKind::AlterConfigs(r) => topics::alter_configs(access, r),
        RequestKind::IncrementalAlterConfigs(r) => topics::incremental_alter_configs(access, r),
        RequestKind::InitProducerId(r) => groups::init_producer_id(access, r),
        RequestKind::FindCoordinator(r) => groups::find_coordinator(access, version, r),
        RequestKind::OffsetCommit(r) => groups::offset_commit(access, r),
        RequestKind::OffsetFetch(r) => groups::offset_fetch(access, r),
        RequestKind::OffsetDelete(r) => groups::offset_delete(access, r),
        RequestKind::ListGroups(r) => groups::list_groups(access, r),
        RequestKind::DescribeGroups(r) => groups::describe_groups(access, r),
        RequestKind::DeleteGroups(r) => groups::delete_groups(access, r),
        body @ (RequestKind::JoinGroup(_)
        | RequestKind::SyncGroup(_)
        | RequestKind::Heartbeat(_)
        | RequestKind::LeaveGroup(_)) => groups::membership(access, body),
        body @ RequestKind::DescribeCluster(_) => cluster_wide(access, Operation::Describe, body),
        body @ (RequestKind::DescribeAcls(_)
        | RequestKind::DescribeUserScramCredentials(_)
        | RequestKind::ListPartitionReassignments(_)
        | RequestKind::DescribeLogDirs(_)) => cluster_wide(access, Operation::Describe, body),
        body @ (RequestKind::CreateAcls(_)
        | RequestKind::DeleteAcls(_)
        | RequestKind::AlterUserScramCredentials(_)
        | RequestKind::AlterPartitionReassignments(_)
        | RequestKind::UnregisterBroker(_)) => cluster_wide(access, Operation::Alter, body),
        RequestKind::ElectLeaders(r) if !access.allows_cluster(Operation::Alter) => {
            Checked::Answer(super::elect::refuse(
                &r,
                version,
                CLUSTER_DENIED,
                "electing leaders needs ALTER on the cluster",
            ))
        }
        // ApiVersions and the SASL APIs are answered before authorization (connection.rs).
        body => Checked::Serve(body, None),
    }
}

/// An API that needs `operation` on the cluster as a whole.
fn cluster_wide(access: &Access, operation: Operation, body: RequestKind) -> Checked {
    if access.allows_cluster(operation) {
        return Checked::Serve(body, None);
    }
    let why = "the principal may not do this on the cluster";
    let answer = match &body {
        RequestKind::DescribeCluster(_) => Some(ResponseKind::DescribeCluster(
            kafka_protocol::messages::DescribeClusterResponse::default()
                .with_error_code(CLUSTER_DENIED.code())
                .with_error_message(Some(why.into())),
        )),
        RequestKind::ListPartitionReassignments(_) => Some(
            ResponseKind::ListPartitionReassignments(
                kafka_protocol::messages::ListPartitionReassignmentsResponse::default()
                    .with_error_code(CLUSTER_DENIED.code())
                    .with_error_message(Some(why.into())),
            ),
        ),
        RequestKind::AlterPartitionReassignments(_) => Some(
            ResponseKind::AlterPartitionReassignments(
                kafka_protocol::messages::AlterPartitionReassignmentsResponse::default()
                    .with_error_code(CLUSTER_DENIED.code())
                    .with_error_message(Some(why.into())),
            ),
        ),
        RequestKind::DescribeLogDirs(_) => Some(ResponseKind::DescribeLogDirs(
            kafka_protocol::messages::DescribeLogDirsResponse::default()
                .with_error_code(CLUSTER_DENIED.code()),
        )),
        RequestKind::UnregisterBroker(_) => Some(ResponseKind::UnregisterBroker(
            kafka_protocol::messages::UnregisterBrokerResponse::default()
                .with_error_code(CLUSTER_DENIED.code())
                .with_error_message(Some(why.into())),
        )),
        RequestKind::DescribeUserScramCredentials(_)
        | RequestKind::AlterUserScramCredentials(_) => super::users::refuse(
            &body,
            "managing SCRAM users needs a super user, or DESCRIBE (listing) or ALTER (changing) on the cluster",
        ),
        _ => super::acls::refuse(&body, CLUSTER_DENIED, why),
    };
    match answer {
        Some(a) => Checked::Answer(a),
        // `check` routes here only bodies with a refusal above; serving one unchecked would be
        // the bug.
        None => unreachable!("cluster_wide got a request it has no refusal for"),
    }
}

/// Splits `items` into those `allowed` and the rest, keeping order.
fn split<T>(items: Vec<T>, allowed: impl Fn(&T) -> bool) -> (Vec<T>, Vec<T>) {
    items.into_iter().partition(|i| allowed(i))
}

/// The outcome for a request whose refused entries are `refused`: served untouched when
/// nothing was refused, answered with `answer(refused)` when nothing is left to serve, else
/// served with `patch(response, refused)`.
fn finish<E: Send + 'static>(
    request: RequestKind,
    nothing_left: bool,
    refused: Vec<E>,
    empty: impl FnOnce() -> ResponseKind,
    patch: impl FnOnce(ResponseKind, Vec<E>) -> ResponseKind + Send + 'static,
) -> Checked {
    if refused.is_empty() {
        return Checked::Serve(request, None);
    }
    if nothing_left {
        return Checked::Answer(patch(empty(), refused));
    }
    Checked::Serve(request, Some(Box::new(move |r| patch(r, refused))))
}
