//! Group APIs on a broker that is not (or not yet) the coordinator: every group is answered
//! NOT_COORDINATOR (COORDINATOR_LOAD_IN_PROGRESS while this broker is catching up as the new
//! coordinator), so clients look the coordinator up again. `group_refusal` also answers a
//! principal whom the ACLs refuse a group (GROUP_AUTHORIZATION_FAILED).

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponseGroup;
use kafka_protocol::messages::ResponseKind;
use kafka_protocol::messages::{
    DeleteGroupsResponse, DescribeGroupsResponse, HeartbeatResponse, JoinGroupResponse,
    LeaveGroupResponse, ListGroupsResponse, OffsetCommitResponse, OffsetDeleteResponse,
    OffsetFetchResponse, RequestKind, SyncGroupResponse,
};
use kafka_protocol::ResponseError;

use crate::cluster::Cluster;
use crate::handlers::Reply;

/// `None` when this broker serves groups now; otherwise the refusal to send.
pub fn refuse(cluster: &Cluster, serving: bool, body: &RequestKind) -> Option<Reply> {
    if serving {
        return None;
    }
    let code = if cluster.offsets.is_leader() {
        ResponseError::CoordinatorLoadInProgress
    } else {
        ResponseError::NotCoordinator
    }
    .code();
    group_refusal(body, code).map(|r| Reply::Now(Box::new(r)))
}

/// The response that refuses every group `body` names with `code` (`None` for a request that
/// is not a group API). Also the answer to a principal the ACLs refuse the group.
pub fn group_refusal(body: &RequestKind, code: i16) -> Option<ResponseKind> {
    let response = match body {
        RequestKind::JoinGroup(_) => {
            ResponseKind::JoinGroup(JoinGroupResponse::default().with_error_code(code))
        }
        RequestKind::SyncGroup(_) => {
            ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(code))
        }
        RequestKind::Heartbeat(_) => {
            ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(code))
        }
        RequestKind::LeaveGroup(_) => {
            ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(code))
        }
        RequestKind::OffsetCommit(req) => ResponseKind::OffsetCommit(
            OffsetCommitResponse::default().with_topics(
                req.topics
                    .iter()
                    .map(|t| {
                        OffsetCommitResponseTopic::default()
                            .with_name(t.name.clone())
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        OffsetCommitResponsePartition::default()
                                            .with_partition_index(p.partition_index)
                                            .with_error_code(code)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            ),
        ),
        // v2-v7 carry a top-level error; v8+ one per group.
        RequestKind::OffsetFetch(req) => ResponseKind::OffsetFetch(
            OffsetFetchResponse::default()
                .with_error_code(code)
                .with_groups(
                    req.groups
                        .iter()
                        .map(|g| {
                            OffsetFetchResponseGroup::default()
                                .with_group_id(g.group_id.clone())
                                .with_error_code(code)
                        })
                        .collect(),
                ),
        ),
        RequestKind::DescribeGroups(req) => ResponseKind::DescribeGroups(
            DescribeGroupsResponse::default().with_groups(
                req.groups
                    .iter()
                    .map(|g| {
                        DescribedGroup::default()
                            .with_group_id(g.clone())
                            .with_error_code(code)
                    })
                    .collect(),
            ),
        ),
        RequestKind::DeleteGroups(req) => ResponseKind::DeleteGroups(
            DeleteGroupsResponse::default().with_results(
                req.groups_names
                    .iter()
                    .map(|g| {
                        DeletableGroupResult::default()
                            .with_group_id(g.clone())
                            .with_error_code(code)
                    })
                    .collect(),
            ),
        ),
        RequestKind::OffsetDelete(_) => {
            ResponseKind::OffsetDelete(OffsetDeleteResponse::default().with_error_code(code))
        }
        // Groups live on the coordinator only; elsewhere the list is empty, not an error.
        RequestKind::ListGroups(_) => ResponseKind::ListGroups(ListGroupsResponse::default()),
        _ => return None,
    };
    Some(response)
}
