//! DescribeAcls, CreateAcls and DeleteAcls (KIP-140). The bindings are the metadata log's
//! (`cluster/acls.rs`); who may call these is `authorize/` (DESCRIBE, ALTER on the cluster).
//! Without `[authorization]` they are answered SECURITY_DISABLED, as Kafka answers them
//! without an authorizer: ACLs that nothing enforces would only mislead.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse, RequestKind, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use kiln_acl::{Binding, Filter, Operation, PatternType, Permission, ResourceType};

use crate::cluster::acls::AclChange;
use crate::cluster::Cluster;
use crate::errors::cluster_error_code;
use crate::handlers::Reply;

/// Creations or filters one request may carry: each is checked and proposed together, and
/// the bound keeps one request's metadata record small.
pub const ACL_CHANGES_PER_REQUEST_MAX: usize = 1_000;

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// The response to an ACL API that cannot be served: `error` for the request as a whole
/// (Describe) or for every creation or filter (Create, Delete).
pub fn refuse(body: &RequestKind, error: ResponseError, why: &'static str) -> Option<ResponseKind> {
    let message = Some(StrBytes::from_static_str(why));
    Some(match body {
        RequestKind::DescribeAcls(_) => ResponseKind::DescribeAcls(
            DescribeAclsResponse::default()
                .with_error_code(error.code())
                .with_error_message(message),
        ),
        RequestKind::CreateAcls(r) => ResponseKind::CreateAcls(
            CreateAclsResponse::default().with_results(
                r.creations
                    .iter()
                    .map(|_| {
                        AclCreationResult::default()
                            .with_error_code(error.code())
                            .with_error_message(message.clone())
                    })
                    .collect(),
            ),
        ),
        RequestKind::DeleteAcls(r) => ResponseKind::DeleteAcls(
            DeleteAclsResponse::default().with_filter_results(
                r.filters
                    .iter()
                    .map(|_| {
                        DeleteAclsFilterResult::default()
                            .with_error_code(error.code())
                            .with_error_message(message.clone())
                    })
                    .collect(),
            ),
        ),
        _ => return None,
    })
}

pub fn describe(cluster: &Cluster, request: DescribeAclsRequest) -> DescribeAclsResponse {
    let filter = Filter::from_wire(
        request.resource_type_filter,
        request.resource_name_filter.map(|s| s.to_string()),
        request.pattern_type_filter,
        request.principal_filter.map(|s| s.to_string()),
        request.host_filter.map(|s| s.to_string()),
        request.operation,
        request.permission_type,
    );
    let filter = match filter {
        Ok(f) => f,
        Err(e) => {
            return DescribeAclsResponse::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(StrBytes::from_string(e)))
        }
    };
    // One entry per resource pattern, its bindings under it, as Kafka groups them.
    let mut by_resource: BTreeMap<(ResourceType, PatternType, String), Vec<AclDescription>> =
        BTreeMap::new();
    for b in cluster.acls_matching(&filter) {
        by_resource
            .entry((b.resource_type, b.pattern, b.name.clone()))
            .or_default()
            .push(
                AclDescription::default()
                    .with_principal(text(&b.principal))
                    .with_host(text(&b.host))
                    .with_operation(b.operation.code())
                    .with_permission_type(b.permission.code()),
            );
    }
    DescribeAclsResponse::default().with_resources(
        by_resource
            .into_iter()
            .map(|((t, p, name), acls)| {
                DescribeAclsResource::default()
                    .with_resource_type(t.code())
                    .with_pattern_type(p.code())
                    .with_resource_name(StrBytes::from_string(name))
                    .with_acls(acls)
            })
            .collect(),
    )
}

/// A creation's binding from its wire codes, or why it cannot be one.
fn binding(
    c: &kafka_protocol::messages::create_acls_request::AclCreation,
) -> Result<Binding, String> {
    let b = Binding {
        resource_type: ResourceType::from_code(c.resource_type).ok_or_else(|| {
            format!(
                "resource type code {} is not TOPIC, GROUP, CLUSTER or TRANSACTIONAL_ID",
                c.resource_type
            )
        })?,
        pattern: PatternType::from_code(c.resource_pattern_type).ok_or_else(|| {
            format!(
                "pattern type code {} is not LITERAL or PREFIXED",
                c.resource_pattern_type
            )
        })?,
        name: c.resource_name.to_string(),
        principal: c.principal.to_string(),
        host: c.host.to_string(),
        operation: Operation::from_code(c.operation)
            .ok_or_else(|| format!("operation code {} is not a concrete operation", c.operation))?,
        permission: Permission::from_code(c.permission_type)
            .ok_or_else(|| format!("permission code {} is not ALLOW or DENY", c.permission_type))?,
    };
    b.validate()?;
    Ok(b)
}

pub fn create(cluster: &Arc<Cluster>, request: CreateAclsRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let too_many = request.creations.len() > ACL_CHANGES_PER_REQUEST_MAX;
        let parsed: Vec<Result<Binding, (ResponseError, String)>> = request
            .creations
            .iter()
            .map(|c| {
                if too_many {
                    return Err((
                        ResponseError::InvalidRequest,
                        format!("at most {ACL_CHANGES_PER_REQUEST_MAX} creations per request"),
                    ));
                }
                binding(c).map_err(|e| (ResponseError::InvalidRequest, e))
            })
            .collect();
        let create: Vec<Binding> = parsed
            .iter()
            .filter_map(|p| p.as_ref().ok().cloned())
            .collect();
        let proposed = cluster
            .change_acls(AclChange {
                create,
                delete: Vec::new(),
            })
            .await
            .map_err(|e| (cluster_error_code(&e), e.to_string()));
        let results = parsed
            .into_iter()
            .map(|p| {
                let outcome = match (p, &proposed) {
                    (Err(e), _) => Err(e),
                    (Ok(_), Err(e)) => Err(e.clone()),
                    (Ok(_), Ok(())) => Ok(()),
                };
                match outcome {
                    Ok(()) => AclCreationResult::default(),
                    Err((code, message)) => {
                        tracing::info!(%message, "ACL creation refused");
                        AclCreationResult::default()
                            .with_error_code(code.code())
                            .with_error_message(Some(StrBytes::from_string(message)))
                    }
                }
            })
            .collect();
        ResponseKind::CreateAcls(CreateAclsResponse::default().with_results(results))
    }))
}

pub fn delete(cluster: &Arc<Cluster>, request: DeleteAclsRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let too_many = request.filters.len() > ACL_CHANGES_PER_REQUEST_MAX;
        let matched: Vec<Result<Vec<Binding>, String>> = request
            .filters
            .into_iter()
            .map(|f| {
                if too_many {
                    return Err(format!(
                        "at most {ACL_CHANGES_PER_REQUEST_MAX} filters per request"
                    ));
                }
                let filter = Filter::from_wire(
                    f.resource_type_filter,
                    f.resource_name_filter.map(|s| s.to_string()),
                    f.pattern_type_filter,
                    f.principal_filter.map(|s| s.to_string()),
                    f.host_filter.map(|s| s.to_string()),
                    f.operation,
                    f.permission_type,
                )?;
                Ok(cluster.acls_matching(&filter))
            })
            .collect();
        let mut delete: Vec<Binding> = matched
            .iter()
            .filter_map(|m| m.as_ref().ok())
            .flatten()
            .cloned()
            .collect();
        delete.sort();
        delete.dedup();
        let proposed = cluster
            .change_acls(AclChange {
                create: Vec::new(),
                delete,
            })
            .await
            .map_err(|e| (cluster_error_code(&e), e.to_string()));
        let results = matched
            .into_iter()
            .map(|m| match (m, &proposed) {
                (Err(e), _) => DeleteAclsFilterResult::default()
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(StrBytes::from_string(e))),
                (Ok(_), Err((code, message))) => DeleteAclsFilterResult::default()
                    .with_error_code(code.code())
                    .with_error_message(Some(StrBytes::from_string(message.clone()))),
                (Ok(bindings), Ok(())) => DeleteAclsFilterResult::default().with_matching_acls(
                    bindings
                        .iter()
                        .map(|b| {
                            DeleteAclsMatchingAcl::default()
                                .with_resource_type(b.resource_type.code())
                                .with_resource_name(text(&b.name))
                                .with_pattern_type(b.pattern.code())
                                .with_principal(text(&b.principal))
                                .with_host(text(&b.host))
                                .with_operation(b.operation.code())
                                .with_permission_type(b.permission.code())
                        })
                        .collect(),
                ),
            })
            .collect();
        ResponseKind::DeleteAcls(DeleteAclsResponse::default().with_filter_results(results))
    }))
}
