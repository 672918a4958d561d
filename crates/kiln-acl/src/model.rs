//! The four enumerations of a binding, with Kafka's wire codes and names. `ANY` (code 1) and
//! `MATCH` exist only in filters (`filter.rs`), so they are not values here; UNKNOWN (0) is
//! never stored.

use serde::{Deserialize, Serialize};

macro_rules! kafka_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $code:literal, $text:literal;)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        pub enum $name {
            $($variant,)+
        }

        impl $name {
            pub const ALL_VALUES: &'static [$name] = &[$($name::$variant,)+];

            /// Kafka's wire code.
            pub fn code(self) -> i8 {
                match self {
                    $($name::$variant => $code,)+
                }
            }

            /// The value of a concrete wire code; `None` for UNKNOWN, ANY, MATCH and codes
            /// this version does not know.
            pub fn from_code(code: i8) -> Option<$name> {
                match code {
                    $($code => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// Kafka's name (`TRANSACTIONAL_ID`), as the Java tools print it.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;

            /// Kafka's name in any case, `-` or `_` between words (`transactional-id`).
            fn from_str(s: &str) -> Result<$name, String> {
                let wanted = s.to_ascii_uppercase().replace('-', "_");
                $name::ALL_VALUES
                    .iter()
                    .copied()
                    .find(|v| v.name() == wanted)
                    .ok_or_else(|| {
                        let names: Vec<&str> = $name::ALL_VALUES.iter().map(|v| v.name()).collect();
                        format!("{s:?} is not one of {}", names.join(", "))
                    })
            }
        }
    };
}

kafka_enum!(
    /// What a binding protects. Kafka also has DELEGATION_TOKEN (6) and USER (7); Kiln has
    /// neither kind of resource.
    ResourceType {
        Topic = 2, "TOPIC";
        Group = 3, "GROUP";
        Cluster = 4, "CLUSTER";
        TransactionalId = 5, "TRANSACTIONAL_ID";
    }
);

kafka_enum!(
    /// How a binding's name selects resources.
    PatternType {
        Literal = 3, "LITERAL";
        Prefixed = 4, "PREFIXED";
    }
);

kafka_enum!(
    /// What a principal does to a resource. CREATE_TOKENS and DESCRIBE_TOKENS (13, 14) are
    /// for delegation tokens, which Kiln does not have.
    Operation {
        All = 2, "ALL";
        Read = 3, "READ";
        Write = 4, "WRITE";
        Create = 5, "CREATE";
        Delete = 6, "DELETE";
        Alter = 7, "ALTER";
        Describe = 8, "DESCRIBE";
        ClusterAction = 9, "CLUSTER_ACTION";
        DescribeConfigs = 10, "DESCRIBE_CONFIGS";
        AlterConfigs = 11, "ALTER_CONFIGS";
        IdempotentWrite = 12, "IDEMPOTENT_WRITE";
    }
);

kafka_enum!(
    Permission {
        Deny = 2, "DENY";
        Allow = 3, "ALLOW";
    }
);

impl Operation {
    /// Whether an ALLOW for `self` allows `asked` (the implications of the crate docs).
    pub fn implies(self, asked: Operation) -> bool {
        use Operation::*;
        self == asked
            || self == All
            || (asked == Describe && matches!(self, Read | Write | Delete | Alter))
            || (asked == DescribeConfigs && self == AlterConfigs)
    }

    /// Whether any API asks for this operation on a resource of this type (Kafka's table of
    /// operations and resources); a binding for another pair would never be consulted.
    pub fn applies_to(self, resource_type: ResourceType) -> bool {
        use Operation::*;
        match resource_type {
            ResourceType::Topic => matches!(
                self,
                All | Read
                    | Write
                    | Create
                    | Delete
                    | Alter
                    | Describe
                    | DescribeConfigs
                    | AlterConfigs
            ),
            ResourceType::Group => matches!(self, All | Read | Delete | Describe),
            ResourceType::Cluster => matches!(
                self,
                All | Create
                    | ClusterAction
                    | DescribeConfigs
                    | AlterConfigs
                    | IdempotentWrite
                    | Alter
                    | Describe
            ),
            ResourceType::TransactionalId => matches!(self, All | Describe | Write),
        }
    }
}
