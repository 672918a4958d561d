//! The group APIs, FindCoordinator and InitProducerId.

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponseGroup;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use kiln_acl::{Operation, ResourceType};

use super::{finish, split, Checked, Patch, CLUSTER_DENIED, GROUP_DENIED, TOPIC_DENIED};
use crate::authorizer::Access;
use crate::handlers::refuse::group_refusal;

fn group(access: &Access, operation: Operation, id: &str) -> bool {
    access.allows(operation, ResourceType::Group, id)
}

/// `body` refused as a whole: every group it names gets GROUP_AUTHORIZATION_FAILED.
fn refuse_group(body: RequestKind) -> Checked {
    match group_refusal(&body, GROUP_DENIED.code()) {
        Some(answer) => Checked::Answer(answer),
        // Only group APIs come here, and group_refusal answers every one of them.
        None => unreachable!("refuse_group got a request that is not a group API"),
    }
}

/// JoinGroup, SyncGroup, Heartbeat, LeaveGroup: READ on the group.
pub fn membership(access: &Access, body: RequestKind) -> Checked {
    let id = match &body {
        RequestKind::JoinGroup(r) => &r.group_id,
        RequestKind::SyncGroup(r) => &r.group_id,
        RequestKind::Heartbeat(r) => &r.group_id,
        RequestKind::LeaveGroup(r) => &r.group_id,
        _ => return Checked::Serve(body, None),
    };
    if group(access, Operation::Read, id) {
        Checked::Serve(body, None)
    } else {
        refuse_group(body)
    }
}

/// InitProducerId: WRITE on the transactional id, or for an idempotent producer
/// IDEMPOTENT_WRITE on the cluster or WRITE on any topic (KIP-679).
pub fn init_producer_id(access: &Access, r: InitProducerIdRequest) -> Checked {
    let refused = match &r.transactional_id {
        Some(id) if !access.allows(Operation::Write, ResourceType::TransactionalId, id) => {
            Some(ResponseError::TransactionalIdAuthorizationFailed)
        }
        Some(_) => None,
        None if access.sees(
            Operation::IdempotentWrite,
            ResourceType::Cluster,
            kiln_acl::CLUSTER_NAME,
        ) || access.allows_any(Operation::Write, ResourceType::Topic) =>
        {
            None
        }
        None => {
            access.log_refusal(
                Operation::IdempotentWrite,
                ResourceType::Cluster,
                kiln_acl::CLUSTER_NAME,
            );
            Some(CLUSTER_DENIED)
        }
    };
    match refused {
        None => Checked::Serve(RequestKind::InitProducerId(r), None),
        Some(error) => Checked::Answer(ResponseKind::InitProducerId(
            InitProducerIdResponse::default()
                .with_error_code(error.code())
                .with_producer_id((-1).into())
                .with_producer_epoch(-1),
        )),
    }
}

/// FindCoordinator: DESCRIBE on the group (key type 0) or transactional id (1).
pub fn find_coordinator(access: &Access, version: i16, mut r: FindCoordinatorRequest) -> Checked {
    let (resource_type, error) = match r.key_type {
        1 => (
            ResourceType::TransactionalId,
            ResponseError::TransactionalIdAuthorizationFailed,
        ),
        _ => (ResourceType::Group, GROUP_DENIED),
    };
    let may = |key: &StrBytes| access.allows(Operation::Describe, resource_type, key);
    if version < 4 {
        if may(&r.key) {
            return Checked::Serve(RequestKind::FindCoordinator(r), None);
        }
        return Checked::Answer(ResponseKind::FindCoordinator(
            FindCoordinatorResponse::default()
                .with_error_code(error.code())
                .with_node_id((-1).into())
                .with_port(-1),
        ));
    }
    let (ok, refused) = split(std::mem::take(&mut r.coordinator_keys), may);
    r.coordinator_keys = ok;
    let nothing_left = r.coordinator_keys.is_empty();
    let refused: Vec<Coordinator> = refused
        .into_iter()
        .map(|key| {
            Coordinator::default()
                .with_key(key)
                .with_node_id((-1).into())
                .with_port(-1)
                .with_error_code(error.code())
        })
        .collect();
    finish(
        RequestKind::FindCoordinator(r),
        nothing_left,
        refused,
        || ResponseKind::FindCoordinator(FindCoordinatorResponse::default()),
        |response, refused| match response {
            ResponseKind::FindCoordinator(mut f) => {
                f.coordinators.extend(refused);
                ResponseKind::FindCoordinator(f)
            }
            other => other,
        },
    )
}

/// OffsetCommit: READ on the group, then READ on each topic.
pub fn offset_commit(access: &Access, mut r: OffsetCommitRequest) -> Checked {
    if !group(access, Operation::Read, &r.group_id) {
        return refuse_group(RequestKind::OffsetCommit(r));
    }
    let (ok, refused) = split(std::mem::take(&mut r.topics), |t| {
        access.allows(Operation::Read, ResourceType::Topic, &t.name)
    });
    r.topics = ok;
    let nothing_left = r.topics.is_empty();
    let refused: Vec<OffsetCommitResponseTopic> = refused
        .into_iter()
        .map(|t| {
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(TOPIC_DENIED.code())
                        })
                        .collect(),
                )
        })
        .collect();
    finish(
        RequestKind::OffsetCommit(r),
        nothing_left,
        refused,
        || ResponseKind::OffsetCommit(OffsetCommitResponse::default()),
        |response, refused| match response {
            ResponseKind::OffsetCommit(mut c) => {
                c.topics.extend(refused);
                ResponseKind::OffsetCommit(c)
            }
            other => other,
        },
    )
}

/// Of an OffsetFetch answer's topics (v1-v7's and v8+'s lists have the same fields under
/// different types), leaves out those `access` may not describe when `listing_all`, else
/// answers their partitions TOPIC_AUTHORIZATION_FAILED with no offset.
macro_rules! hide_topics {
    ($topics:expr, $access:expr, $listing_all:expr) => {{
        let listing_all = $listing_all;
        $topics.retain_mut(|t| {
            if $access.sees(Operation::Describe, ResourceType::Topic, &t.name) {
                return true;
            }
            for p in &mut t.partitions {
                p.committed_offset = -1;
                p.metadata = None;
                p.error_code = TOPIC_DENIED.code();
            }
            !listing_all
        });
    }};
}

/// OffsetFetch: DESCRIBE on each group; of a group's topics, those the principal may not
/// describe are left out of an all-topics fetch and answered TOPIC_AUTHORIZATION_FAILED when
/// named. v1-v7 carry one group at the top level, v8+ a list.
pub fn offset_fetch(access: &Access, mut r: OffsetFetchRequest) -> Checked {
    if r.groups.is_empty() {
        if !group(access, Operation::Describe, &r.group_id) {
            return refuse_group(RequestKind::OffsetFetch(r));
        }
        let listing_all = r.topics.is_none();
        let access = access.clone();
        let patch: Patch = Box::new(move |response| match response {
            ResponseKind::OffsetFetch(mut f) => {
                hide_topics!(f.topics, access, listing_all);
                ResponseKind::OffsetFetch(f)
            }
            other => other,
        });
        return Checked::Serve(RequestKind::OffsetFetch(r), Some(patch));
    }
    let (ok, refused) = split(std::mem::take(&mut r.groups), |g| {
        group(access, Operation::Describe, &g.group_id)
    });
    r.groups = ok;
    let listing_all: std::collections::BTreeSet<GroupId> = r
        .groups
        .iter()
        .filter(|g| g.topics.is_none())
        .map(|g| g.group_id.clone())
        .collect();
    let nothing_left = r.groups.is_empty();
    let refused: Vec<OffsetFetchResponseGroup> = refused
        .into_iter()
        .map(|g| {
            OffsetFetchResponseGroup::default()
                .with_group_id(g.group_id)
                .with_error_code(GROUP_DENIED.code())
        })
        .collect();
    let access = access.clone();
    let patch = move |response: ResponseKind, refused: Vec<OffsetFetchResponseGroup>| match response
    {
        ResponseKind::OffsetFetch(mut f) => {
            for g in &mut f.groups {
                hide_topics!(g.topics, access, listing_all.contains(&g.group_id));
            }
            f.groups.extend(refused);
            ResponseKind::OffsetFetch(f)
        }
        other => other,
    };
    if refused.is_empty() {
        // Still patched: the topics of each group are filtered.
        return Checked::Serve(
            RequestKind::OffsetFetch(r),
            Some(Box::new(move |resp| patch(resp, Vec::new()))),
        );
    }
    finish(
        RequestKind::OffsetFetch(r),
        nothing_left,
        refused,
        || ResponseKind::OffsetFetch(OffsetFetchResponse::default()),
        patch,
    )
}

/// OffsetDelete: DELETE on the group, then READ on each topic.
pub fn offset_delete(access: &Access, mut r: OffsetDeleteRequest) -> Checked {
    if !group(access, Operation::Delete, &r.group_id) {
        return refuse_group(RequestKind::OffsetDelete(r));
    }
    let (ok, refused) = split(std::mem::take(&mut r.topics), |t| {
        access.allows(Operation::Read, ResourceType::Topic, &t.name)
    });
    r.topics = ok;
    let nothing_left = r.topics.is_empty();
    let refused: Vec<OffsetDeleteResponseTopic> = refused
        .into_iter()
        .map(|t| {
            OffsetDeleteResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(TOPIC_DENIED.code())
                        })
                        .collect(),
                )
        })
        .collect();
    finish(
        RequestKind::OffsetDelete(r),
        nothing_left,
        refused,
        || ResponseKind::OffsetDelete(OffsetDeleteResponse::default()),
        |response, refused| match response {
            ResponseKind::OffsetDelete(mut d) => {
                d.topics.extend(refused);
                ResponseKind::OffsetDelete(d)
            }
            other => other,
        },
    )
}

/// ListGroups: every group with DESCRIBE on the cluster, else those the principal may
/// describe.
pub fn list_groups(access: &Access, r: ListGroupsRequest) -> Checked {
    if access.sees(
        Operation::Describe,
        ResourceType::Cluster,
        kiln_acl::CLUSTER_NAME,
    ) {
        return Checked::Serve(RequestKind::ListGroups(r), None);
    }
    let access = access.clone();
    let patch: Patch = Box::new(move |response| match response {
        ResponseKind::ListGroups(mut l) => {
            l.groups
                .retain(|g| access.sees(Operation::Describe, ResourceType::Group, &g.group_id));
            ResponseKind::ListGroups(l)
        }
        other => other,
    });
    Checked::Serve(RequestKind::ListGroups(r), Some(patch))
}

/// DescribeGroups: DESCRIBE on each group.
pub fn describe_groups(access: &Access, mut r: DescribeGroupsRequest) -> Checked {
    let (ok, refused) = split(std::mem::take(&mut r.groups), |g| {
        group(access, Operation::Describe, g)
    });
    r.groups = ok;
    let nothing_left = r.groups.is_empty();
    let refused: Vec<DescribedGroup> = refused
        .into_iter()
        .map(|g| {
            DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(GROUP_DENIED.code())
        })
        .collect();
    finish(
        RequestKind::DescribeGroups(r),
        nothing_left,
        refused,
        || ResponseKind::DescribeGroups(DescribeGroupsResponse::default()),
        |response, refused| match response {
            ResponseKind::DescribeGroups(mut d) => {
                d.groups.extend(refused);
                ResponseKind::DescribeGroups(d)
            }
            other => other,
        },
    )
}

/// DeleteGroups: DELETE on each group.
pub fn delete_groups(access: &Access, mut r: DeleteGroupsRequest) -> Checked {
    let (ok, refused) = split(std::mem::take(&mut r.groups_names), |g| {
        group(access, Operation::Delete, g)
    });
    r.groups_names = ok;
    let nothing_left = r.groups_names.is_empty();
    let refused: Vec<DeletableGroupResult> = refused
        .into_iter()
        .map(|g| {
            DeletableGroupResult::default()
                .with_group_id(g)
                .with_error_code(GROUP_DENIED.code())
        })
        .collect();
    finish(
        RequestKind::DeleteGroups(r),
        nothing_left,
        refused,
        || ResponseKind::DeleteGroups(DeleteGroupsResponse::default()),
        |response, refused| match response {
            ResponseKind::DeleteGroups(mut d) => {
                d.results.extend(refused);
                ResponseKind::DeleteGroups(d)
            }
            other => other,
        },
    )
}
