//! One module per Kafka API. `dispatch` runs the part of a request that must happen in arrival
//! order (appends to a proposer), and returns either the response or a future that completes it
//! (replication waits, long polls, metadata changes).

pub mod acls;
pub mod admin;
pub mod api_versions;
mod authorize;
pub mod configs;
pub mod elect;
pub mod fetch;
pub mod groups;
pub mod init_producer_id;
pub mod list_offsets;
pub mod log_dirs;
pub mod metadata;
pub mod offsets;
pub mod partitions;
pub mod produce;
pub mod reassign;
pub mod refuse;
pub mod users;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use kafka_protocol::messages::{RequestHeader, RequestKind, ResponseKind};
use kiln_wire::DecodedRequest;

use crate::authorizer::Access;
use crate::server::Broker;

pub type PendingResponse = Pin<Box<dyn Future<Output = ResponseKind> + Send>>;

pub enum Reply {
    /// Boxed: responses are large and most requests finish later anyway.
    Now(Box<ResponseKind>),
    Later(PendingResponse),
    /// The request gets no response (produce with acks=0).
    Silent,
    /// The request cannot be answered in its own format; hang up and log why.
    Close(&'static str),
}

/// Authorizes `request` for `access` (`authorize/`), then serves what it may.
pub fn dispatch(broker: &Arc<Broker>, request: DecodedRequest, access: &Access) -> Reply {
    let version = request.header.request_api_version;
    let (body, patch) = match authorize::check(access, version, request.body) {
        authorize::Checked::Answer(answer) => return Reply::Now(Box::new(answer)),
        authorize::Checked::Serve(body, patch) => (body, patch),
    };
    let reply = serve(broker, version, request.header, body, access);
    let Some(patch) = patch else {
        return reply;
    };
    match reply {
        Reply::Now(body) => Reply::Now(Box::new(patch(*body))),
        Reply::Later(pending) => Reply::Later(Box::pin(async move { patch(pending.await) })),
        other @ (Reply::Silent | Reply::Close(_)) => other,
    }
}

fn serve(
    broker: &Arc<Broker>,
    version: i16,
    header: RequestHeader,
    body: RequestKind,
    access: &Access,
) -> Reply {
    let cluster = &broker.cluster;
    match body {
        RequestKind::ApiVersions(_) => Reply::Now(Box::new(ResponseKind::ApiVersions(
            api_versions::response(0),
        ))),
        RequestKind::Metadata(req) => {
            let (broker, cluster) = (broker.clone(), cluster.clone());
            let listener: Arc<str> = access.listener().into();
            Reply::Later(Box::pin(async move {
                ResponseKind::Metadata(metadata::handle(broker, cluster, listener, req).await)
            }))
        }
        RequestKind::Produce(req) => produce::handle(cluster, req),
        RequestKind::Fetch(req) => fetch::handle(cluster, broker.config.fetch_max_wait_ms_cap, req),
        RequestKind::ListOffsets(req) => Reply::Now(Box::new(ResponseKind::ListOffsets(
            list_offsets::handle(cluster, req),
        ))),
        RequestKind::CreateTopics(req) => {
            admin::create_topics(cluster, broker.config.default_partitions, req, version)
        }
        RequestKind::DeleteTopics(req) => admin::delete_topics(cluster, req),
        RequestKind::InitProducerId(req) => init_producer_id::handle(cluster, req),
        RequestKind::DescribeConfigs(req) => Reply::Now(Box::new(ResponseKind::DescribeConfigs(
            configs::describe_configs(cluster, &broker.config, req),
        ))),
        RequestKind::IncrementalAlterConfigs(req) => {
            configs::incremental_alter_configs(cluster, req)
        }
        RequestKind::AlterConfigs(req) => configs::alter_configs(cluster, req),
        RequestKind::CreatePartitions(req) => partitions::create_partitions(cluster, req),
        RequestKind::DeleteRecords(req) => partitions::delete_records(cluster, req),
        RequestKind::ElectLeaders(req) => elect::elect_leaders(cluster, req, version),
        RequestKind::AlterPartitionReassignments(req) => reassign::alter(cluster, req),
        RequestKind::ListPartitionReassignments(req) => Reply::Now(Box::new(
            ResponseKind::ListPartitionReassignments(reassign::list(cluster, req)),
        )),
        RequestKind::UnregisterBroker(req) => reassign::unregister(cluster, req),
        RequestKind::DescribeLogDirs(req) => {
            Reply::Now(Box::new(ResponseKind::DescribeLogDirs(log_dirs::describe(
                cluster,
                &broker
                    .config
                    .data_dir
                    .join("replicas")
                    .display()
                    .to_string(),
                req,
            ))))
        }
        RequestKind::DescribeCluster(req) => Reply::Now(Box::new(ResponseKind::DescribeCluster(
            metadata::describe_cluster(
                broker,
                cluster,
                access.listener(),
                req.include_cluster_authorized_operations,
            ),
        ))),
        RequestKind::DescribeUserScramCredentials(req) => Reply::Now(Box::new(
            ResponseKind::DescribeUserScramCredentials(users::describe(cluster, req)),
        )),
        RequestKind::AlterUserScramCredentials(req) => users::alter(cluster, req),
        body @ (RequestKind::DescribeAcls(_)
        | RequestKind::CreateAcls(_)
        | RequestKind::DeleteAcls(_))
            if !access.enforced() =>
        {
            match acls::refuse(
                &body,
                kafka_protocol::ResponseError::SecurityDisabled,
                "ACLs are not enforced on this broker: it has no [authorization]",
            ) {
                Some(answer) => Reply::Now(Box::new(answer)),
                None => Reply::Close("ACL request without a refusal"),
            }
        }
        RequestKind::DescribeAcls(req) => Reply::Now(Box::new(ResponseKind::DescribeAcls(
            acls::describe(cluster, req),
        ))),
        RequestKind::CreateAcls(req) => acls::create(cluster, req),
        RequestKind::DeleteAcls(req) => acls::delete(cluster, req),
        body => {
            let serving = broker.groups.store().is_serving();
            match refuse::refuse(cluster, serving, &body) {
                Some(refusal) => refusal,
                None => dispatch_groups(broker, version, body, header, access.listener()),
            }
        }
    }
}

fn dispatch_groups(
    broker: &Arc<Broker>,
    version: i16,
    body: RequestKind,
    header: RequestHeader,
    listener: &str,
) -> Reply {
    match body {
        RequestKind::FindCoordinator(req) => Reply::Now(Box::new(ResponseKind::FindCoordinator(
            groups::find_coordinator(broker, req, version, listener),
        ))),
        RequestKind::JoinGroup(req) => {
            groups::join_group(broker, req, version, header.client_id.as_ref())
        }
        RequestKind::SyncGroup(req) => groups::sync_group(broker, req, version),
        RequestKind::Heartbeat(req) => Reply::Now(Box::new(ResponseKind::Heartbeat(
            groups::heartbeat(broker, req),
        ))),
        RequestKind::LeaveGroup(req) => Reply::Now(Box::new(ResponseKind::LeaveGroup(
            groups::leave_group(broker, req, version),
        ))),
        RequestKind::OffsetCommit(req) => offsets::offset_commit(broker, req),
        RequestKind::OffsetFetch(req) => Reply::Now(Box::new(ResponseKind::OffsetFetch(
            offsets::offset_fetch(broker, req, version),
        ))),
        RequestKind::ListGroups(req) => Reply::Now(Box::new(ResponseKind::ListGroups(
            groups::list_groups(broker, req, version),
        ))),
        RequestKind::DescribeGroups(req) => Reply::Now(Box::new(ResponseKind::DescribeGroups(
            groups::describe_groups(broker, req, version),
        ))),
        RequestKind::DeleteGroups(req) => groups::delete_groups(broker, req),
        RequestKind::OffsetDelete(req) => offsets::offset_delete(broker, req),
        // decode_request admits only the APIs in kiln_wire::SUPPORTED_APIS, all matched above.
        _ => Reply::Close("request type has no handler"),
    }
}
