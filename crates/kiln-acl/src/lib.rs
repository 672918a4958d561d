//! Kafka's ACL model (KIP-140, KIP-290 for prefixed patterns) and the authorization decision.
//!
//! A [`Binding`] says: `principal` connecting from `host` is allowed (or denied) `operation`
//! on the resources a (`resource_type`, `pattern`, `name`) names. A [`Filter`] selects bindings
//! (DescribeAcls, DeleteAcls). [`Acls`] holds a cluster's bindings and answers
//! [`Acls::authorize`] exactly as Kafka's `StandardAuthorizer` does:
//!
//! 1. a super user may do anything;
//! 2. a matching DENY for the operation (or for ALL) refuses, whatever else allows;
//! 3. a matching ALLOW for the operation, for ALL, or for an operation that implies it
//!    (READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS)
//!    allows;
//! 4. otherwise the request is refused, unless no binding at all names the resource and
//!    `allow_everyone_if_no_acl_found` is set.
//!
//! A binding matches a resource when it is of the same type and its pattern is LITERAL with
//! the resource's name or the wildcard `*`, or PREFIXED with a prefix of the name. Its
//! principal matches when equal or `User:*`; its host when equal or `*`.
//!
//! The codes are Kafka's (`org.apache.kafka.common.acl` and `.resource`), so a binding goes
//! over the wire as it is stored.

mod filter;
mod model;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

pub use filter::{Filter, NamePattern};
pub use model::{Operation, PatternType, Permission, ResourceType};

/// Bindings a cluster holds, at most: every broker keeps them in memory and scans the ones of
/// a resource type on each check, so the set must stay small.
pub const BINDINGS_MAX: usize = 10_000;
/// Longest resource name, principal or host a binding may hold, in bytes (topic names are at
/// most 249; group ids and principals have no protocol limit, so one is set here).
pub const FIELD_BYTES_MAX: usize = 1_024;
/// The name of the one cluster resource, as Kafka names it.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// The wildcard resource name, principal (`User:*`) and host.
pub const WILDCARD: &str = "*";
pub const WILDCARD_PRINCIPAL: &str = "User:*";

/// One ACL.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    pub resource_type: ResourceType,
    pub pattern: PatternType,
    pub name: String,
    pub principal: String,
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

impl Binding {
    /// Refuses a binding Kafka would refuse to create, saying which field is wrong.
    pub fn validate(&self) -> Result<(), String> {
        for (field, value) in [
            ("resource name", &self.name),
            ("principal", &self.principal),
            ("host", &self.host),
        ] {
            if value.is_empty() {
                return Err(format!("the {field} is empty"));
            }
            if value.len() > FIELD_BYTES_MAX {
                return Err(format!(
                    "the {field} is {} bytes, over the limit of {FIELD_BYTES_MAX}",
                    value.len()
                ));
            }
        }
        match self.principal.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
            _ => {
                return Err(format!(
                    "principal {:?} is not of the form <type>:<name> (for example User:alice)",
                    self.principal
                ))
            }
        }
        if self.resource_type == ResourceType::Cluster && self.name != CLUSTER_NAME {
            return Err(format!(
                "a cluster resource is named {CLUSTER_NAME:?}, not {:?}",
                self.name
            ));
        }
        if self.pattern == PatternType::Prefixed && self.name == WILDCARD {
            return Err("a prefixed pattern cannot be the wildcard \"*\"; use LITERAL *".into());
        }
        if !self.operation.applies_to(self.resource_type) {
            return Err(format!(
                "operation {} does not apply to a {} resource",
                self.operation, self.resource_type
            ));
        }
        Ok(())
    }

    /// Whether this binding names the resource `resource_type`/`name`.
    fn names(&self, resource_type: ResourceType, name: &str) -> bool {
        self.resource_type == resource_type
            && match self.pattern {
                PatternType::Literal => self.name == name || self.name == WILDCARD,
                PatternType::Prefixed => name.starts_with(self.name.as_str()),
            }
    }

    fn is_for(&self, principal: &str, host: &str) -> bool {
        (self.principal == principal || self.principal == WILDCARD_PRINCIPAL)
            && (self.host == host || self.host == WILDCARD)
    }
}

impl std::fmt::Display for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {}:{} {:?} from {} {}",
            self.permission,
            self.operation,
            self.resource_type,
            self.pattern,
            self.name,
            self.host,
            self.principal
        )
    }
}

/// What [`Acls::authorize`] is asked about.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub principal: &'a str,
    pub host: &'a str,
    pub operation: Operation,
    pub resource_type: ResourceType,
    pub name: &'a str,
}

/// A cluster's bindings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acls {
    bindings: BTreeSet<Binding>,
}

impl Acls {
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Binding> {
        self.bindings.iter()
    }

    /// Adds `binding` (already validated by whoever proposed it); `false` when present.
    pub fn insert(&mut self, binding: Binding) -> bool {
        self.bindings.insert(binding)
    }

    /// Removes `binding`; `false` when absent.
    pub fn remove(&mut self, binding: &Binding) -> bool {
        self.bindings.remove(binding)
    }

    /// The bindings `filter` selects.
    pub fn matching<'a>(&'a self, filter: &'a Filter) -> impl Iterator<Item = &'a Binding> {
        self.bindings.iter().filter(|b| filter.selects(b))
    }

    /// The decision of the module docs, rules 2 to 4 (super users are the caller's: they are
    /// configuration, not bindings).
    pub fn authorize(&self, request: Request<'_>, allow_everyone_if_no_acl_found: bool) -> bool {
        let mut any_names_it = false;
        let mut allowed = false;
        for b in self
            .bindings
            .iter()
            .filter(|b| b.names(request.resource_type, request.name))
        {
            any_names_it = true;
            if !b.is_for(request.principal, request.host) {
                continue;
            }
            match b.permission {
                Permission::Deny
                    if b.operation == request.operation || b.operation == Operation::All =>
                {
                    return false
                }
                Permission::Deny => {}
                Permission::Allow => allowed |= b.operation.implies(request.operation),
            }
        }
        allowed || (!any_names_it && allow_everyone_if_no_acl_found)
    }

    /// Whether `principal` from `host` may do `operation` on at least one resource of
    /// `resource_type` (KIP-679: WRITE on any topic lets a producer be idempotent): some ALLOW
    /// names it there that no DENY of the same pattern and name cancels.
    pub fn authorize_any(
        &self,
        principal: &str,
        host: &str,
        operation: Operation,
        resource_type: ResourceType,
    ) -> bool {
        let denied = |allow: &Binding| {
            self.bindings.iter().any(|d| {
                d.permission == Permission::Deny
                    && d.resource_type == resource_type
                    && d.is_for(principal, host)
                    && (d.operation == operation || d.operation == Operation::All)
                    && ((d.pattern == PatternType::Literal && d.name == WILDCARD)
                        || (d.pattern == allow.pattern && d.name == allow.name))
            })
        };
        self.bindings.iter().any(|b| {
            b.resource_type == resource_type
                && b.permission == Permission::Allow
                && b.is_for(principal, host)
                && b.operation.implies(operation)
                && !denied(b)
        })
    }
}

#[cfg(test)]
mod tests;
