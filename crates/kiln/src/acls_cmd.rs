//! `kiln acls`: the ACLs of a broker with `[authorization]`, over the Kafka protocol
//! (CreateAcls, DeleteAcls, DescribeAcls), so it works against Apache Kafka too.
//!
//! A resource is one of `--topic NAME`, `--group NAME`, `--transactional-id NAME` or
//! `--cluster`; `--prefixed` makes NAME a prefix. `create` needs a principal, one or more
//! operations and `--allow` or `--deny`; `delete` and `list` take the same flags as filters,
//! each one left out matching anything (`delete` refuses to run with no filter at all unless
//! told `--all`).

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{
    CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest, RequestKind, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use kiln_acl::{Operation, PatternType, Permission, ResourceType};
use kiln_client::Connection;

use crate::broker_address::BrokerAddress;
use crate::topics_cmd::error_text;

#[derive(Args, Debug)]
pub struct AclsArgs {
    #[command(flatten)]
    broker: BrokerAddress,
    #[command(subcommand)]
    command: AclsCommand,
}

#[derive(Subcommand, Debug)]
enum AclsCommand {
    /// Allow (or deny) a principal operations on a resource.
    Create {
        #[command(flatten)]
        acl: AclFlags,
    },
    /// Delete the ACLs the flags select.
    Delete {
        #[command(flatten)]
        acl: AclFlags,
        /// Delete every ACL when no other flag narrows the selection.
        #[arg(long)]
        all: bool,
    },
    /// Print the ACLs the flags select (all without flags).
    List {
        #[command(flatten)]
        acl: AclFlags,
    },
}

#[derive(Args, Debug, Default)]
struct AclFlags {
    /// `User:<name>` (a SASL user), `User:<certificate subject>`, or `User:*` for everyone.
    #[arg(long)]
    principal: Option<String>,
    /// read, write, create, delete, alter, describe, describe-configs, alter-configs,
    /// idempotent-write, cluster-action or all; repeat for several.
    #[arg(long = "operation")]
    operations: Vec<String>,
    #[arg(long, conflicts_with = "deny")]
    allow: bool,
    #[arg(long)]
    deny: bool,
    #[arg(long, conflicts_with_all = ["group", "transactional_id", "cluster"])]
    topic: Option<String>,
    #[arg(long, conflicts_with_all = ["transactional_id", "cluster"])]
    group: Option<String>,
    #[arg(long, conflicts_with = "cluster")]
    transactional_id: Option<String>,
    /// The cluster itself (creating topics, managing users and ACLs, describing the cluster).
    #[arg(long)]
    cluster: bool,
    /// The resource name is a prefix (`--topic kiln.` covers every kiln.* topic).
    #[arg(long)]
    prefixed: bool,
    /// The client address the ACL applies to (default: any, `*`).
    #[arg(long)]
    host: Option<String>,
}

impl AclFlags {
    fn resource(&self) -> Option<(ResourceType, String)> {
        if let Some(t) = &self.topic {
            return Some((ResourceType::Topic, t.clone()));
        }
        if let Some(g) = &self.group {
            return Some((ResourceType::Group, g.clone()));
        }
        if let Some(t) = &self.transactional_id {
            return Some((ResourceType::TransactionalId, t.clone()));
        }
        self.cluster
            .then(|| (ResourceType::Cluster, kiln_acl::CLUSTER_NAME.to_string()))
    }

    fn operations(&self) -> anyhow::Result<Vec<Operation>> {
        self.operations
            .iter()
            .map(|o| {
                o.parse::<Operation>()
                    .map_err(|e| anyhow::anyhow!("--operation {e}"))
            })
            .collect()
    }

    fn permission(&self) -> Option<Permission> {
        match (self.allow, self.deny) {
            (true, _) => Some(Permission::Allow),
            (_, true) => Some(Permission::Deny),
            _ => None,
        }
    }

    fn pattern(&self) -> PatternType {
        if self.prefixed {
            PatternType::Prefixed
        } else {
            PatternType::Literal
        }
    }

    /// The bindings `create` asks for, every field checked as the broker will.
    fn bindings(&self) -> anyhow::Result<Vec<kiln_acl::Binding>> {
        let (resource_type, name) = self
            .resource()
            .context("name a resource: --topic, --group, --transactional-id or --cluster")?;
        let principal = self
            .principal
            .clone()
            .context("--principal User:<name> is required")?;
        let permission = self.permission().context("say --allow or --deny")?;
        let operations = self.operations()?;
        if operations.is_empty() {
            bail!("name at least one --operation");
        }
        operations
            .into_iter()
            .map(|operation| {
                let b = kiln_acl::Binding {
                    resource_type,
                    pattern: self.pattern(),
                    name: name.clone(),
                    principal: principal.clone(),
                    host: self
                        .host
                        .clone()
                        .unwrap_or_else(|| kiln_acl::WILDCARD.into()),
                    operation,
                    permission,
                };
                b.validate().map_err(anyhow::Error::msg)?;
                Ok(b)
            })
            .collect()
    }

    /// The filters `delete` and `list` send: one per operation named, or one for any.
    fn filters(&self) -> anyhow::Result<Vec<DeleteAclsFilter>> {
        const ANY: i8 = 1;
        let resource = self.resource();
        let operations = self.operations()?;
        let operation_codes: Vec<i8> = if operations.is_empty() {
            vec![ANY]
        } else {
            operations.iter().map(|o| o.code()).collect()
        };
        let text = |s: &Option<String>| s.clone().map(StrBytes::from_string);
        Ok(operation_codes
            .into_iter()
            .map(|operation| {
                DeleteAclsFilter::default()
                    .with_resource_type_filter(resource.as_ref().map_or(ANY, |(t, _)| t.code()))
                    .with_resource_name_filter(
                        resource
                            .as_ref()
                            .map(|(_, n)| StrBytes::from_string(n.clone())),
                    )
                    .with_pattern_type_filter(if resource.is_some() || self.prefixed {
                        self.pattern().code()
                    } else {
                        ANY
                    })
                    .with_principal_filter(text(&self.principal))
                    .with_host_filter(text(&self.host))
                    .with_operation(operation)
                    .with_permission_type(self.permission().map_or(ANY, |p| p.code()))
            })
            .collect())
    }

    fn narrows(&self) -> bool {
        self.resource().is_some()
            || self.principal.is_some()
            || !self.operations.is_empty()
            || self.permission().is_some()
            || self.host.is_some()
    }
}

pub async fn run(args: AclsArgs) -> anyhow::Result<()> {
    let timeout = args.broker.timeout();
    let mut conn = args.broker.connect().await?;
    match args.command {
        AclsCommand::Create { acl } => create(&mut conn, timeout, &acl).await,
        AclsCommand::Delete { acl, all } => {
            if !all && !acl.narrows() {
                bail!("no flag selects which ACLs to delete; pass --all to delete every ACL");
            }
            delete(&mut conn, timeout, &acl).await
        }
        AclsCommand::List { acl } => list(&mut conn, timeout, &acl).await,
    }
}

async fn create(
    conn: &mut Connection,
    timeout: std::time::Duration,
    acl: &AclFlags,
) -> anyhow::Result<()> {
    let bindings = acl.bindings()?;
    create_bindings(conn, timeout, &bindings).await?;
    for b in &bindings {
        println!("created: {b}");
    }
    Ok(())
}

/// Creates `bindings` with one CreateAcls request; the first refusal is the error, naming its
/// binding.
pub async fn create_bindings(
    conn: &mut Connection,
    timeout: std::time::Duration,
    bindings: &[kiln_acl::Binding],
) -> anyhow::Result<()> {
    let creations = bindings
        .iter()
        .map(|b| {
            AclCreation::default()
                .with_resource_type(b.resource_type.code())
                .with_resource_name(StrBytes::from_string(b.name.clone()))
                .with_resource_pattern_type(b.pattern.code())
                .with_principal(StrBytes::from_string(b.principal.clone()))
                .with_host(StrBytes::from_string(b.host.clone()))
                .with_operation(b.operation.code())
                .with_permission_type(b.permission.code())
        })
        .collect();
    let request = CreateAclsRequest::default().with_creations(creations);
    let ResponseKind::CreateAcls(r) = conn.call(RequestKind::CreateAcls(request), timeout).await?
    else {
        bail!("unexpected answer to CreateAcls");
    };
    if r.results.len() != bindings.len() {
        bail!(
            "CreateAcls answered {} results for {} bindings",
            r.results.len(),
            bindings.len()
        );
    }
    for (b, result) in bindings.iter().zip(&r.results) {
        if result.error_code != 0 {
            bail!(
                "{b}: {}",
                error_text(result.error_code, result.error_message.as_ref())
            );
        }
    }
    Ok(())
}

async fn delete(
    conn: &mut Connection,
    timeout: std::time::Duration,
    acl: &AclFlags,
) -> anyhow::Result<()> {
    let request = DeleteAclsRequest::default().with_filters(acl.filters()?);
    let ResponseKind::DeleteAcls(r) = conn.call(RequestKind::DeleteAcls(request), timeout).await?
    else {
        bail!("unexpected answer to DeleteAcls");
    };
    let mut deleted = 0;
    for result in r.filter_results {
        if result.error_code != 0 {
            bail!(
                "DeleteAcls: {}",
                error_text(result.error_code, result.error_message.as_ref())
            );
        }
        deleted += result.matching_acls.len();
    }
    println!("{deleted} ACL(s) deleted");
    Ok(())
}

async fn list(
    conn: &mut Connection,
    timeout: std::time::Duration,
    acl: &AclFlags,
) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for f in acl.filters()? {
        let request = DescribeAclsRequest::default()
            .with_resource_type_filter(f.resource_type_filter)
            .with_resource_name_filter(f.resource_name_filter)
            .with_pattern_type_filter(f.pattern_type_filter)
            .with_principal_filter(f.principal_filter)
            .with_host_filter(f.host_filter)
            .with_operation(f.operation)
            .with_permission_type(f.permission_type);
        let ResponseKind::DescribeAcls(r) = conn
            .call(RequestKind::DescribeAcls(request), timeout)
            .await?
        else {
            bail!("unexpected answer to DescribeAcls");
        };
        if r.error_code != 0 {
            bail!(
                "DescribeAcls: {}",
                error_text(r.error_code, r.error_message.as_ref())
            );
        }
        for resource in r.resources {
            let kind = ResourceType::from_code(resource.resource_type)
                .map_or_else(|| resource.resource_type.to_string(), |t| t.to_string());
            let pattern = PatternType::from_code(resource.pattern_type)
                .map_or_else(|| resource.pattern_type.to_string(), |p| p.to_string());
            for a in resource.acls {
                let op = Operation::from_code(a.operation)
                    .map_or_else(|| a.operation.to_string(), |o| o.to_string());
                let permission = Permission::from_code(a.permission_type)
                    .map_or_else(|| a.permission_type.to_string(), |p| p.to_string());
                rows.push([
                    a.principal.to_string(),
                    permission,
                    op,
                    kind.clone(),
                    pattern.clone(),
                    resource.resource_name.to_string(),
                    a.host.to_string(),
                ]);
            }
        }
    }
    rows.sort();
    rows.dedup();
    println!(
        "{:<28} {:<6} {:<17} {:<17} {:<9} {:<24} HOST",
        "PRINCIPAL", "ACCESS", "OPERATION", "RESOURCE", "PATTERN", "NAME"
    );
    for [principal, permission, op, kind, pattern, name, host] in rows {
        println!(
            "{principal:<28} {permission:<6} {op:<17} {kind:<17} {pattern:<9} {name:<24} {host}"
        );
    }
    Ok(())
}
