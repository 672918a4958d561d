//! Filters: DescribeAcls and DeleteAcls select bindings with one. Each field is either a value
//! or "any" (`None`); the pattern field has a third choice, MATCH, which selects every binding
//! that would apply to the named resource (literal, wildcard and prefixed ones), as
//! `kafka-acls --resource-pattern-type match` does.

use crate::{Binding, Operation, PatternType, Permission, ResourceType, WILDCARD};

/// How a filter selects by pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamePattern {
    /// Any pattern type; the name, if given, must equal the binding's.
    Any,
    /// Exactly this pattern type and (if given) name.
    Exactly(PatternType),
    /// Bindings that apply to the resource the name names.
    Match,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub resource_type: Option<ResourceType>,
    pub name: Option<String>,
    pub pattern: NamePattern,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<Operation>,
    pub permission: Option<Permission>,
}

/// Kafka's filter codes: ANY is 1 everywhere, MATCH is 2 for patterns.
const ANY: i8 = 1;
const MATCH: i8 = 2;

impl Filter {
    /// The filter that selects every binding.
    pub fn any() -> Filter {
        Filter {
            resource_type: None,
            name: None,
            pattern: NamePattern::Any,
            principal: None,
            host: None,
            operation: None,
            permission: None,
        }
    }

    /// A filter from its wire codes; an UNKNOWN or unheard-of code is refused by name.
    pub fn from_wire(
        resource_type: i8,
        name: Option<String>,
        pattern: i8,
        principal: Option<String>,
        host: Option<String>,
        operation: i8,
        permission: i8,
    ) -> Result<Filter, String> {
        fn one<T>(code: i8, what: &str, parse: fn(i8) -> Option<T>) -> Result<Option<T>, String> {
            if code == ANY {
                return Ok(None);
            }
            parse(code)
                .map(Some)
                .ok_or_else(|| format!("{what} code {code} is not a known value or ANY"))
        }
        let pattern = match pattern {
            ANY => NamePattern::Any,
            MATCH => NamePattern::Match,
            code => NamePattern::Exactly(
                PatternType::from_code(code)
                    .ok_or_else(|| format!("pattern type code {code} is not a known value"))?,
            ),
        };
        Ok(Filter {
            resource_type: one(resource_type, "resource type", ResourceType::from_code)?,
            name,
            pattern,
            principal,
            host,
            operation: one(operation, "operation", Operation::from_code)?,
            permission: one(permission, "permission", Permission::from_code)?,
        })
    }

    /// Whether this filter selects `b`.
    pub fn selects(&self, b: &Binding) -> bool {
        let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        let name_ok = match (self.pattern, &self.name) {
            (NamePattern::Any, name) => same(name, &b.name),
            (NamePattern::Exactly(p), name) => p == b.pattern && same(name, &b.name),
            (NamePattern::Match, None) => true,
            (NamePattern::Match, Some(name)) => match b.pattern {
                PatternType::Literal => b.name == *name || b.name == WILDCARD,
                PatternType::Prefixed => name.starts_with(b.name.as_str()),
            },
        };
        self.resource_type.is_none_or(|t| t == b.resource_type)
            && name_ok
            && same(&self.principal, &b.principal)
            && same(&self.host, &b.host)
            && self.operation.is_none_or(|o| o == b.operation)
            && self.permission.is_none_or(|p| p == b.permission)
    }
}
