use super::*;

fn binding(
    resource_type: ResourceType,
    pattern: PatternType,
    name: &str,
    principal: &str,
    operation: Operation,
    permission: Permission,
) -> Binding {
    Binding {
        resource_type,
        pattern,
        name: name.into(),
        principal: principal.into(),
        host: WILDCARD.into(),
        operation,
        permission,
    }
}

fn ask<'a>(principal: &'a str, op: Operation, t: ResourceType, name: &'a str) -> Request<'a> {
    Request {
        principal,
        host: "10.0.0.7",
        operation: op,
        resource_type: t,
        name,
    }
}

use Operation::*;
use PatternType::*;
use Permission::*;
use ResourceType::*;

#[test]
fn nothing_is_allowed_without_a_binding_unless_everyone_is() {
    let acls = Acls::default();
    let r = ask("User:alice", Read, Topic, "kiln.nodes");
    assert!(!acls.authorize(r, false));
    assert!(acls.authorize(r, true));
}

#[test]
fn a_binding_on_a_resource_stops_everyone_else_even_when_everyone_is_allowed() {
    let mut acls = Acls::default();
    acls.insert(binding(
        Topic,
        Literal,
        "kiln.nodes",
        "User:intake",
        Write,
        Allow,
    ));
    assert!(acls.authorize(ask("User:intake", Write, Topic, "kiln.nodes"), true));
    assert!(!acls.authorize(ask("User:agent", Write, Topic, "kiln.nodes"), true));
    // Another topic has no binding, so the fallback applies there.
    assert!(acls.authorize(ask("User:agent", Write, Topic, "other"), true));
}

#[test]
fn literal_wildcard_and_prefixed_patterns_name_resources() {
    let mut acls = Acls::default();
    acls.insert(binding(Topic, Prefixed, "kiln.", "User:a", Read, Allow));
    acls.insert(binding(Group, Literal, "*", "User:a", Read, Allow));
    acls.insert(binding(Topic, Literal, "x", "User:*", Describe, Allow));
    assert!(acls.authorize(ask("User:a", Read, Topic, "kiln.nodes"), false));
    assert!(acls.authorize(ask("User:a", Read, Topic, "kiln."), false));
    assert!(!acls.authorize(ask("User:a", Read, Topic, "kiln"), false));
    assert!(acls.authorize(ask("User:a", Read, Group, "burnin"), false));
    assert!(acls.authorize(ask("User:anyone", Describe, Topic, "x"), false));
    assert!(!acls.authorize(ask("User:anyone", Describe, Topic, "xy"), false));
}

#[test]
fn deny_wins_and_all_covers_every_operation() {
    let mut acls = Acls::default();
    acls.insert(binding(Topic, Prefixed, "kiln.", "User:a", All, Allow));
    acls.insert(binding(Topic, Literal, "kiln.secret", "User:a", Read, Deny));
    assert!(acls.authorize(ask("User:a", Write, Topic, "kiln.nodes"), false));
    assert!(acls.authorize(ask("User:a", Write, Topic, "kiln.secret"), false));
    assert!(!acls.authorize(ask("User:a", Read, Topic, "kiln.secret"), false));
    acls.insert(binding(Topic, Literal, "*", "User:*", All, Deny));
    assert!(!acls.authorize(ask("User:a", Write, Topic, "kiln.nodes"), false));
}

#[test]
fn read_write_delete_and_alter_imply_describe_but_a_deny_of_read_does_not_deny_describe() {
    for op in [Read, Write, Delete, Alter] {
        let mut acls = Acls::default();
        acls.insert(binding(Topic, Literal, "t", "User:a", op, Allow));
        assert!(
            acls.authorize(ask("User:a", Describe, Topic, "t"), false),
            "{op}"
        );
        assert!(
            !acls.authorize(ask("User:a", Create, Topic, "t"), false),
            "{op}"
        );
    }
    let mut acls = Acls::default();
    acls.insert(binding(Topic, Literal, "t", "User:a", AlterConfigs, Allow));
    assert!(acls.authorize(ask("User:a", DescribeConfigs, Topic, "t"), false));
    acls.insert(binding(Topic, Literal, "t", "User:a", Describe, Allow));
    acls.insert(binding(Topic, Literal, "t", "User:a", Read, Deny));
    assert!(acls.authorize(ask("User:a", Describe, Topic, "t"), false));
}

#[test]
fn hosts_must_match_unless_the_binding_says_any() {
    let mut acls = Acls::default();
    let mut b = binding(Topic, Literal, "t", "User:a", Read, Allow);
    b.host = "10.0.0.8".into();
    acls.insert(b);
    assert!(!acls.authorize(ask("User:a", Read, Topic, "t"), false));
    let mut r = ask("User:a", Read, Topic, "t");
    r.host = "10.0.0.8";
    assert!(acls.authorize(r, false));
}

#[test]
fn write_on_any_topic_counts_for_idempotence_unless_denied_there() {
    let mut acls = Acls::default();
    assert!(!acls.authorize_any("User:p", "h", Write, Topic));
    acls.insert(binding(
        Topic,
        Literal,
        "kiln.nodes",
        "User:p",
        Write,
        Allow,
    ));
    assert!(acls.authorize_any("User:p", "h", Write, Topic));
    assert!(!acls.authorize_any("User:q", "h", Write, Topic));
    acls.insert(binding(Topic, Literal, "kiln.nodes", "User:p", Write, Deny));
    assert!(!acls.authorize_any("User:p", "h", Write, Topic));
}

#[test]
fn validation_names_the_wrong_field() {
    let good = binding(Topic, Literal, "t", "User:a", Read, Allow);
    assert_eq!(good.validate(), Ok(()));
    let cases: Vec<(Binding, &str)> = vec![
        (
            Binding {
                name: String::new(),
                ..good.clone()
            },
            "resource name",
        ),
        (
            Binding {
                principal: "alice".into(),
                ..good.clone()
            },
            "principal",
        ),
        (
            Binding {
                host: "x".repeat(FIELD_BYTES_MAX + 1),
                ..good.clone()
            },
            "host",
        ),
        (
            Binding {
                resource_type: Cluster,
                name: "c".into(),
                operation: Describe,
                ..good.clone()
            },
            "kafka-cluster",
        ),
        (
            Binding {
                pattern: Prefixed,
                name: "*".into(),
                ..good.clone()
            },
            "wildcard",
        ),
        (
            Binding {
                resource_type: Group,
                operation: Write,
                ..good.clone()
            },
            "does not apply",
        ),
    ];
    for (b, says) in cases {
        let error = b.validate().expect_err(says);
        assert!(error.contains(says), "{error:?} should say {says:?}");
    }
}

#[test]
fn filters_select_by_each_field_and_match_selects_what_applies() {
    let mut acls = Acls::default();
    let lit = binding(Topic, Literal, "kiln.nodes", "User:a", Read, Allow);
    let wild = binding(Topic, Literal, "*", "User:b", Write, Deny);
    let pre = binding(Topic, Prefixed, "kiln.", "User:a", Write, Allow);
    let group = binding(Group, Literal, "burnin", "User:a", Read, Allow);
    for b in [&lit, &wild, &pre, &group] {
        acls.insert(b.clone());
    }
    let got = |f: Filter| acls.matching(&f).cloned().collect::<Vec<_>>().len();
    assert_eq!(got(Filter::any()), 4);
    let topics = Filter {
        resource_type: Some(Topic),
        ..Filter::any()
    };
    assert_eq!(got(topics.clone()), 3);
    let exact = Filter {
        name: Some("kiln.nodes".into()),
        ..topics.clone()
    };
    assert_eq!(got(exact.clone()), 1);
    let matching = Filter {
        pattern: NamePattern::Match,
        ..exact.clone()
    };
    assert_eq!(got(matching), 3);
    let prefixed = Filter {
        pattern: NamePattern::Exactly(Prefixed),
        ..topics.clone()
    };
    assert_eq!(got(prefixed), 1);
    assert_eq!(
        got(Filter {
            principal: Some("User:a".into()),
            ..Filter::any()
        }),
        3
    );
    assert_eq!(
        got(Filter {
            permission: Some(Deny),
            ..Filter::any()
        }),
        1
    );
    assert_eq!(
        got(Filter {
            operation: Some(Write),
            ..Filter::any()
        }),
        2
    );
}

#[test]
fn wire_codes_round_trip_and_unknown_codes_are_refused() {
    for t in ResourceType::ALL_VALUES {
        assert_eq!(ResourceType::from_code(t.code()), Some(*t));
    }
    for o in Operation::ALL_VALUES {
        assert_eq!(Operation::from_code(o.code()), Some(*o));
    }
    assert_eq!(ResourceType::from_code(0), None);
    assert_eq!(Operation::from_code(1), None);
    let any = Filter::from_wire(1, None, 1, None, None, 1, 1).expect("all ANY");
    assert_eq!(any, Filter::any());
    assert_eq!(
        Filter::from_wire(1, None, 2, None, None, 1, 1).map(|f| f.pattern),
        Ok(NamePattern::Match)
    );
    let bad = Filter::from_wire(9, None, 1, None, None, 1, 1).expect_err("code 9");
    assert!(bad.contains("resource type code 9"), "{bad}");
    assert!(Filter::from_wire(2, None, 0, None, None, 1, 1).is_err());
}

#[test]
fn names_parse_in_any_case_and_the_store_format_is_kafka_s_names() {
    assert_eq!(
        "transactional-id".parse::<ResourceType>(),
        Ok(TransactionalId)
    );
    assert_eq!("Describe_Configs".parse::<Operation>(), Ok(DescribeConfigs));
    let e = "reed".parse::<Operation>().expect_err("typo");
    assert!(e.contains("READ"), "{e}");
    let b = binding(TransactionalId, Prefixed, "intake-", "User:a", Write, Allow);
    let json = serde_json::to_string(&b).expect("encodes");
    assert!(
        json.contains("\"TRANSACTIONAL_ID\"") && json.contains("\"PREFIXED\""),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<Binding>(&json).ok(), Some(b));
}
