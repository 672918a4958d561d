//! FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups, DescribeGroups and
//! DeleteGroups: Kafka messages in and out of the coordinator (`crate::groups`).
//!
//! The coordinator's state changes happen here, in arrival order; only the waits (for the join
//! phase to end, for the leader's assignment, for tombstones to be fsynced) finish later.

use std::sync::Arc;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator as CoordinatorEntry;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, ResponseKind, SyncGroupRequest,
    SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::time::Instant;

use crate::groups::coordinator::{Answer, JoinOutcome, JoinParams, SyncOutcome, SyncParams};
use crate::groups::records::GROUP_ID_LEN_MAX;
use crate::handlers::Reply;
use crate::server::Broker;
use crate::time::now_ms;

/// FindCoordinator key type for consumer groups (1 is transactions, which Kiln does not serve).
const KEY_TYPE_GROUP: i8 = 0;
/// Keys answered in one FindCoordinator v4+ request.
const COORDINATOR_KEYS_MAX: usize = 10_000;

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn now_reply(kind: ResponseKind) -> Reply {
    Reply::Now(Box::new(kind))
}

// -------------------------------------------------------------------- FindCoordinator

/// FindCoordinator for a request that came in on `listener`: the coordinator's address on it.
pub fn find_coordinator(
    broker: &Arc<Broker>,
    request: FindCoordinatorRequest,
    version: i16,
    listener: &str,
) -> FindCoordinatorResponse {
    // The coordinator is the leader of the replicated offsets group.
    let cluster = &broker.cluster;
    let coordinator = cluster.broker(cluster.offsets.leader().0).and_then(|b| {
        let (host, port) = b.endpoint(listener)?;
        Some((b.id, (host.to_string(), port)))
    });
    let (node, host, port, unavailable) = match coordinator {
        Some((id, (host, port))) => (BrokerId(id), s(&host), port, false),
        None => (BrokerId(-1), s(""), -1, true),
    };
    let check = |key: &StrBytes| -> Result<(), (ResponseError, String)> {
        if unavailable {
            return Err((
                ResponseError::CoordinatorNotAvailable,
                "the consumer offsets group has no leader yet".into(),
            ));
        }
        if request.key_type != KEY_TYPE_GROUP {
            return Err((
                ResponseError::InvalidRequest,
                format!("key type {} is not served: Kiln coordinates consumer groups only (no transactions)", request.key_type),
            ));
        }
        if key.is_empty() || key.len() > GROUP_ID_LEN_MAX {
            return Err((
                ResponseError::InvalidGroupId,
                format!("group id must be 1 to {GROUP_ID_LEN_MAX} bytes"),
            ));
        }
        Ok(())
    };
    if version >= 4 {
        let coordinators = request
            .coordinator_keys
            .iter()
            .take(COORDINATOR_KEYS_MAX)
            .map(|key| {
                let entry = CoordinatorEntry::default().with_key(key.clone());
                match check(key) {
                    Ok(()) => entry
                        .with_node_id(node)
                        .with_host(host.clone())
                        .with_port(port),
                    Err((e, message)) => entry
                        .with_node_id(BrokerId(-1))
                        .with_host(s(""))
                        .with_port(-1)
                        .with_error_code(e.code())
                        .with_error_message(Some(s(&message))),
                }
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let response = FindCoordinatorResponse::default();
    match check(&request.key) {
        Ok(()) => response.with_node_id(node).with_host(host).with_port(port),
        Err((e, message)) => {
            let r = response
                .with_node_id(BrokerId(-1))
                .with_host(s(""))
                .with_port(-1)
                .with_error_code(e.code());
            if version >= 1 {
                r.with_error_message(Some(s(&message)))
            } else {
                r
            }
        }
    }
}

// -------------------------------------------------------------------- JoinGroup

pub fn join_group(
    broker: &Arc<Broker>,
    request: JoinGroupRequest,
    version: i16,
    client_id: Option<&StrBytes>,
) -> Reply {
    let member_id = request.member_id.to_string();
    let params = JoinParams {
        group_id: request.group_id.0.to_string(),
        member_id: member_id.clone(),
        group_instance_id: request.group_instance_id.map(|i| i.to_string()),
        client_id: client_id.map(|c| c.to_string()).unwrap_or_default(),
        // The peer address is not passed to handlers; DescribeGroups shows an empty host.
        client_host: String::new(),
        session_timeout_ms: request.session_timeout_ms,
        rebalance_timeout_ms: if version >= 1 {
            request.rebalance_timeout_ms
        } else {
            -1
        },
        protocol_type: request.protocol_type.to_string(),
        protocols: request
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        require_known_member_id: version >= 4,
        reason: request.reason.map(|r| r.to_string()),
    };
    match broker.groups.join(params, Instant::now()) {
        Answer::Now(outcome) => now_reply(ResponseKind::JoinGroup(join_response(outcome, version))),
        Answer::Later(rx) => Reply::Later(Box::pin(async move {
            let outcome = rx.await.unwrap_or_else(|_| {
                JoinOutcome::error(ResponseError::RebalanceInProgress, &member_id)
            });
            ResponseKind::JoinGroup(join_response(outcome, version))
        })),
    }
}

fn join_response(o: JoinOutcome, version: i16) -> JoinGroupResponse {
    let members = o
        .members
        .into_iter()
        .map(|(id, instance, metadata)| {
            JoinGroupResponseMember::default()
                .with_member_id(s(&id))
                .with_group_instance_id(if version >= 5 {
                    instance.map(|i| s(&i))
                } else {
                    None
                })
                .with_metadata(metadata)
        })
        .collect();
    // Before v7 the protocol name is a non-nullable string.
    let protocol_name = match o.protocol_name {
        Some(n) => Some(s(&n)),
        None if version < 7 => Some(s("")),
        None => None,
    };
    JoinGroupResponse::default()
        .with_error_code(o.error_code)
        .with_generation_id(o.generation_id)
        .with_protocol_type(if version >= 7 {
            o.protocol_type.map(|t| s(&t))
        } else {
            None
        })
        .with_protocol_name(protocol_name)
        .with_leader(s(&o.leader))
        .with_member_id(s(&o.member_id))
        .with_members(members)
}

// -------------------------------------------------------------------- SyncGroup

pub fn sync_group(broker: &Arc<Broker>, request: SyncGroupRequest, version: i16) -> Reply {
    let params = SyncParams {
        group_id: request.group_id.0.to_string(),
        generation_id: request.generation_id,
        member_id: request.member_id.to_string(),
        protocol_type: request.protocol_type.map(|t| t.to_string()),
        protocol_name: request.protocol_name.map(|n| n.to_string()),
        assignments: request
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect(),
    };
    match broker.groups.sync(params, Instant::now()) {
        Answer::Now(outcome) => now_reply(ResponseKind::SyncGroup(sync_response(outcome, version))),
        Answer::Later(rx) => Reply::Later(Box::pin(async move {
            let outcome = rx
                .await
                .unwrap_or_else(|_| SyncOutcome::error(ResponseError::RebalanceInProgress));
            ResponseKind::SyncGroup(sync_response(outcome, version))
        })),
    }
}

fn sync_response(o: SyncOutcome, version: i16) -> SyncGroupResponse {
    let response = SyncGroupResponse::default()
        .with_error_code(o.error_code)
        .with_assignment(o.assignment);
    if version >= 5 {
        response
            .with_protocol_type(o.protocol_type.map(|t| s(&t)))
            .with_protocol_name(o.protocol_name.map(|n| s(&n)))
    } else {
        response
    }
}

// -------------------------------------------------------------------- Heartbeat, LeaveGroup

pub fn heartbeat(broker: &Arc<Broker>, request: HeartbeatRequest) -> HeartbeatResponse {
    let error = broker.groups.heartbeat(
        request.group_id.0.as_str(),
        request.member_id.as_str(),
        request.generation_id,
        Instant::now(),
    );
    HeartbeatResponse::default().with_error_code(error)
}

pub fn leave_group(
    broker: &Arc<Broker>,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let group_id = request.group_id.0.to_string();
    if version < 3 {
        let error =
            match broker
                .groups
                .leave(&group_id, &[request.member_id.to_string()], Instant::now())
            {
                Ok(errors) => errors.first().copied().unwrap_or(0),
                Err(e) => e,
            };
        return LeaveGroupResponse::default().with_error_code(error);
    }
    // From v3 one request may remove several members; errors are per member, and the top level
    // carries only group-wide ones.
    let ids: Vec<String> = request
        .members
        .iter()
        .map(|m| m.member_id.to_string())
        .collect();
    let (top, errors) = match broker.groups.leave(&group_id, &ids, Instant::now()) {
        Ok(errors) => (0, errors),
        Err(e) => (e, vec![e; ids.len()]),
    };
    let members = request
        .members
        .into_iter()
        .zip(errors)
        .map(|(m, e)| {
            MemberResponse::default()
                .with_member_id(m.member_id)
                .with_group_instance_id(m.group_instance_id)
                .with_error_code(e)
        })
        .collect();
    LeaveGroupResponse::default()
        .with_error_code(top)
        .with_members(members)
}

// -------------------------------------------------------------------- ListGroups, DescribeGroups, DeleteGroups

pub fn list_groups(
    broker: &Arc<Broker>,
    request: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    let states: Vec<String> = request
        .states_filter
        .iter()
        .map(|f| f.to_ascii_lowercase())
        .collect();
    let types: Vec<String> = request
        .types_filter
        .iter()
        .map(|f| f.to_ascii_lowercase())
        .collect();
    // Every Kiln group is a classic (JoinGroup/SyncGroup) group.
    if !types.is_empty() && !types.iter().any(|t| t == "classic") {
        return ListGroupsResponse::default();
    }
    let groups = broker
        .groups
        .list()
        .into_iter()
        .filter(|(_, _, state)| {
            states.is_empty() || states.iter().any(|f| *f == state.to_ascii_lowercase())
        })
        .map(|(id, protocol_type, state)| {
            let listed = ListedGroup::default()
                .with_group_id(GroupId(s(&id)))
                .with_protocol_type(s(&protocol_type));
            let listed = if version >= 4 {
                listed.with_group_state(s(state))
            } else {
                listed
            };
            if version >= 5 {
                listed.with_group_type(s("classic"))
            } else {
                listed
            }
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

pub fn describe_groups(
    broker: &Arc<Broker>,
    request: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let groups = request
        .groups
        .into_iter()
        .map(|group_id| {
            let id = group_id.0.to_string();
            if id.is_empty() || id.len() > GROUP_ID_LEN_MAX {
                return DescribedGroup::default()
                    .with_group_id(group_id)
                    .with_error_code(ResponseError::InvalidGroupId.code());
            }
            let Some(d) = broker.groups.describe(&id) else {
                // As Kafka answers before DescribeGroups v6: a group that does not exist is "Dead".
                return DescribedGroup::default()
                    .with_group_id(group_id)
                    .with_group_state(s("Dead"));
            };
            let members = d
                .members
                .into_iter()
                .map(|m| {
                    DescribedGroupMember::default()
                        .with_member_id(s(&m.member_id))
                        .with_group_instance_id(if version >= 4 {
                            m.group_instance_id.map(|i| s(&i))
                        } else {
                            None
                        })
                        .with_client_id(s(&m.client_id))
                        .with_client_host(s(&m.client_host))
                        .with_member_metadata(m.metadata)
                        .with_member_assignment(m.assignment)
                })
                .collect();
            DescribedGroup::default()
                .with_group_id(group_id)
                .with_group_state(s(d.state))
                .with_protocol_type(s(&d.protocol_type))
                .with_protocol_data(s(&d.protocol))
                .with_members(members)
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

pub fn delete_groups(broker: &Arc<Broker>, request: DeleteGroupsRequest) -> Reply {
    let ids: Vec<String> = request
        .groups_names
        .iter()
        .map(|g| g.0.to_string())
        .collect();
    let (mut errors, tickets) = broker.groups.delete(&ids, now_ms());
    let broker = broker.clone();
    Reply::Later(Box::pin(async move {
        for (index, ticket) in tickets {
            if let Err(e) = broker.groups.store().wait(ticket).await {
                tracing::error!(group = %ids.get(index).map_or("", String::as_str), error = %e, "group deletion not durable");
                if let Some(slot) = errors.get_mut(index) {
                    *slot = ResponseError::CoordinatorNotAvailable.code();
                }
            }
        }
        let results = request
            .groups_names
            .into_iter()
            .zip(errors)
            .map(|(g, e)| {
                DeletableGroupResult::default()
                    .with_group_id(g)
                    .with_error_code(e)
            })
            .collect();
        ResponseKind::DeleteGroups(DeleteGroupsResponse::default().with_results(results))
    }))
}
