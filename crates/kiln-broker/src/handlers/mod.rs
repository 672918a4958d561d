//! One module per Kafka API. `dispatch` runs the part of a request that must
//! happen in arrival order (appends), and returns either the response or a
//! future that completes it (fsync waits, long polls, file-system work).

pub mod admin;
pub mod api_versions;
pub mod fetch;
pub mod groups;
pub mod list_offsets;
pub mod metadata;
pub mod offsets;
pub mod produce;
pub mod replicated;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use kafka_protocol::messages::{RequestHeader, RequestKind, ResponseKind};
use kiln_wire::DecodedRequest;

use crate::cluster::Cluster;
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

pub fn dispatch(broker: &Arc<Broker>, request: DecodedRequest) -> Reply {
    let version = request.header.request_api_version;
    match request.body {
        RequestKind::ApiVersions(_) => Reply::Now(Box::new(ResponseKind::ApiVersions(
            api_versions::response(0),
        ))),
        body => match &broker.cluster {
            Some(cluster) => dispatch_replicated(broker, cluster, version, body, request.header),
            None => dispatch_standalone(broker, version, body, request.header),
        },
    }
}

/// Cluster mode: topic APIs go to the replicated side; group APIs are shared (their offsets
/// store writes through the replicated offsets group).
fn dispatch_replicated(
    broker: &Arc<Broker>,
    cluster: &Arc<Cluster>,
    version: i16,
    body: RequestKind,
    header: RequestHeader,
) -> Reply {
    match body {
        RequestKind::Metadata(req) => {
            let (broker, cluster) = (broker.clone(), cluster.clone());
            Reply::Later(Box::pin(async move {
                ResponseKind::Metadata(replicated::metadata::handle(broker, cluster, req).await)
            }))
        }
        RequestKind::Produce(req) => replicated::produce::handle(cluster, req),
        RequestKind::Fetch(req) => {
            replicated::fetch::handle(cluster, broker.config.fetch_max_wait_ms_cap, req)
        }
        RequestKind::ListOffsets(req) => Reply::Now(Box::new(ResponseKind::ListOffsets(
            replicated::list_offsets::handle(cluster, req),
        ))),
        RequestKind::CreateTopics(req) => replicated::admin::create_topics(
            cluster,
            broker.config.default_partitions,
            req,
            version,
        ),
        RequestKind::DeleteTopics(req) => replicated::admin::delete_topics(cluster, req),
        body => {
            let serving = broker.groups.store().is_serving();
            match replicated::groups::refuse(cluster, serving, &body) {
                Some(refusal) => refusal,
                None => dispatch_groups(broker, version, body, header),
            }
        }
    }
}

fn dispatch_standalone(
    broker: &Arc<Broker>,
    version: i16,
    body: RequestKind,
    header: RequestHeader,
) -> Reply {
    match body {
        RequestKind::ApiVersions(_) => Reply::Now(Box::new(ResponseKind::ApiVersions(
            api_versions::response(0),
        ))),
        // With auto-create on, a Metadata request may create topics (file-system work): keep
        // that off the async workers, as CreateTopics does.
        RequestKind::Metadata(req) if broker.config.auto_create_topics => {
            let broker = broker.clone();
            Reply::Later(Box::pin(async move {
                let handled =
                    tokio::task::spawn_blocking(move || metadata::handle(&broker, req)).await;
                match handled {
                    Ok(response) => ResponseKind::Metadata(response),
                    Err(e) => {
                        tracing::error!(error = %e, "metadata task failed");
                        ResponseKind::Metadata(Default::default())
                    }
                }
            }))
        }
        RequestKind::Metadata(req) => Reply::Now(Box::new(ResponseKind::Metadata(
            metadata::handle(broker, req),
        ))),
        RequestKind::Produce(req) => produce::handle(broker, req),
        RequestKind::Fetch(req) => fetch::handle(broker, req),
        RequestKind::ListOffsets(req) => Reply::Now(Box::new(ResponseKind::ListOffsets(
            list_offsets::handle(broker, req),
        ))),
        RequestKind::CreateTopics(req) => admin::create_topics(broker, req, version),
        RequestKind::DeleteTopics(req) => admin::delete_topics(broker, req),
        body => dispatch_groups(broker, version, body, header),
    }
}

fn dispatch_groups(
    broker: &Arc<Broker>,
    version: i16,
    body: RequestKind,
    header: RequestHeader,
) -> Reply {
    match body {
        RequestKind::FindCoordinator(req) => Reply::Now(Box::new(ResponseKind::FindCoordinator(
            groups::find_coordinator(broker, req, version),
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
        // decode_request admits only the APIs in kiln_wire::SUPPORTED_APIS, all matched above.
        _ => Reply::Close("request type has no handler"),
    }
}
