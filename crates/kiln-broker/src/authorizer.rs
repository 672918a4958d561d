//! Who a connection is, and what it may do: `[authorization]` against the cluster's ACLs
//! (kiln-acl; the bindings live in the metadata log, `cluster/acls.rs`).
//!
//! A connection's principal is its SASL user (`User:<name>`) once it has authenticated, else
//! its client certificate's subject (`User:<DN>`, mutual TLS), else `User:ANONYMOUS`, as in
//! Kafka. Its host is the client's IP address. Without `[authorization]` every check passes,
//! at the cost of one branch.

use std::collections::BTreeSet;
use std::sync::Arc;

use kiln_acl::{Operation, Request, ResourceType};

use crate::cluster::Cluster;
use crate::config::BrokerConfig;

/// The principal of a client that presented neither SASL credentials nor a certificate.
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// `[authorization]`, parsed once.
pub struct Authorizer {
    super_users: BTreeSet<String>,
    allow_everyone_if_no_acl_found: bool,
}

impl Authorizer {
    /// `None` without `[authorization]`.
    pub fn new(config: &BrokerConfig) -> Option<Arc<Authorizer>> {
        let settings = config.authorization.as_ref()?;
        let sasl_users = config
            .sasl
            .iter()
            .flat_map(|s| s.super_users.iter().chain(s.bootstrap_user.iter()))
            .map(|user| format!("User:{user}"));
        Some(Arc::new(Authorizer {
            super_users: settings
                .super_users
                .iter()
                .cloned()
                .chain(sasl_users)
                .collect(),
            allow_everyone_if_no_acl_found: settings.allow_everyone_if_no_acl_found,
        }))
    }
}

/// One connection's principal and host, and the rules to check them against.
#[derive(Clone)]
pub struct Access {
    principal: Arc<str>,
    host: Arc<str>,
    listener: Arc<str>,
    rules: Option<(Arc<Authorizer>, Arc<Cluster>)>,
}

impl Access {
    pub fn new(
        principal: &str,
        host: std::net::IpAddr,
        listener: &str,
        authorizer: Option<&Arc<Authorizer>>,
        cluster: &Arc<Cluster>,
    ) -> Access {
        Access {
            principal: principal.into(),
            host: host.to_string().into(),
            listener: listener.into(),
            rules: authorizer.map(|a| (a.clone(), cluster.clone())),
        }
    }

    /// The listener the connection came in on: Metadata, DescribeCluster and FindCoordinator
    /// answer with the brokers' addresses on it.
    pub fn listener(&self) -> &str {
        &self.listener
    }

    /// Whether ACLs are checked on this listener (`[authorization]` is set).
    pub fn enforced(&self) -> bool {
        self.rules.is_some()
    }

    /// Whether this connection may do `operation` on the resource `resource_type`/`name`; a
    /// refusal is logged.
    pub fn allows(&self, operation: Operation, resource_type: ResourceType, name: &str) -> bool {
        self.decide(operation, resource_type, name, true)
    }

    /// `allows`, without logging a refusal: for listings, which leave out what the principal
    /// may not see rather than refuse it.
    pub fn sees(&self, operation: Operation, resource_type: ResourceType, name: &str) -> bool {
        self.decide(operation, resource_type, name, false)
    }

    fn decide(
        &self,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
        log: bool,
    ) -> bool {
        let Some((authorizer, cluster)) = &self.rules else {
            return true;
        };
        if authorizer.super_users.contains(&*self.principal) {
            return true;
        }
        let allowed = cluster.authorize(
            Request {
                principal: &self.principal,
                host: &self.host,
                operation,
                resource_type,
                name,
            },
            authorizer.allow_everyone_if_no_acl_found,
        );
        if !allowed && log {
            self.log_refusal(operation, resource_type, name);
        }
        allowed
    }

    /// Logs a refusal the caller decided on (`sees` then a second rule, as InitProducerId).
    pub fn log_refusal(&self, operation: Operation, resource_type: ResourceType, name: &str) {
        // A client retrying a refused request in a loop gets a counted budget of lines.
        static REFUSALS: kiln_tls::LogBudget = kiln_tls::LogBudget::new();
        if let Some(left_out) = REFUSALS.allow() {
            tracing::info!(principal = %self.principal, host = %self.host, %operation, %resource_type, resource = name, left_out, "request refused by the ACLs");
        }
    }

    /// `allows` on the one cluster resource.
    pub fn allows_cluster(&self, operation: Operation) -> bool {
        self.allows(operation, ResourceType::Cluster, kiln_acl::CLUSTER_NAME)
    }

    /// Whether `operation` is allowed on at least one resource of `resource_type` (KIP-679).
    pub fn allows_any(&self, operation: Operation, resource_type: ResourceType) -> bool {
        let Some((authorizer, cluster)) = &self.rules else {
            return true;
        };
        authorizer.super_users.contains(&*self.principal)
            || cluster.authorize_any(&self.principal, &self.host, operation, resource_type)
    }
}
