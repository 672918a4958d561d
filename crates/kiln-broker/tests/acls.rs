//! ACL enforcement over real TCP, API by API, on a broker with `[authorization]` and
//! `allow_everyone_if_no_acl_found`: the anonymous client may do what no ACL names, so it can
//! write ACLs that then restrict it (the SASL and real-client side is tests/test_acls.py).
#![allow(clippy::unwrap_used)]

mod groups_common;

use groups_common::*;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;
use kiln_acl::{Operation, PatternType, Permission, ResourceType};
use kiln_broker::config::AuthorizationSettings;
use kiln_client::Connection;

const ANONYMOUS: &str = "User:ANONYMOUS";

fn code(e: ResponseError) -> i16 {
    e.code()
}

async fn create_acl(
    conn: &mut Connection,
    t: ResourceType,
    pattern: PatternType,
    name: &str,
    op: Operation,
    permission: Permission,
) -> i16 {
    let creation = AclCreation::default()
        .with_resource_type(t.code())
        .with_resource_name(s(name))
        .with_resource_pattern_type(pattern.code())
        .with_principal(s(ANONYMOUS))
        .with_host(s("*"))
        .with_operation(op.code())
        .with_permission_type(permission.code());
    let request = CreateAclsRequest::default().with_creations(vec![creation]);
    match conn
        .call(RequestKind::CreateAcls(request), T)
        .await
        .unwrap()
    {
        ResponseKind::CreateAcls(r) => r.results[0].error_code,
        other => panic!("CreateAcls answered {other:?}"),
    }
}

/// DescribeAcls of every binding of `resource_type` (1: any). The codec's defaults are an
/// empty name, principal and host, which match nothing, so each is set to "any" (null).
fn describe_filter(resource_type: i8) -> DescribeAclsRequest {
    DescribeAclsRequest::default()
        .with_resource_type_filter(resource_type)
        .with_resource_name_filter(None)
        .with_pattern_type_filter(1)
        .with_principal_filter(None)
        .with_host_filter(None)
        .with_operation(1)
        .with_permission_type(1)
}

async fn metadata(conn: &mut Connection, topics: Option<&[&str]>) -> Vec<(String, i16)> {
    let request = MetadataRequest::default()
        .with_allow_auto_topic_creation(false)
        .with_topics(topics.map(|ts| {
            ts.iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t))))
                .collect()
        }));
    match conn.call(RequestKind::Metadata(request), T).await.unwrap() {
        ResponseKind::Metadata(r) => r
            .topics
            .iter()
            .map(|t| {
                let name = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                (name, t.error_code)
            })
            .collect(),
        other => panic!("Metadata answered {other:?}"),
    }
}

async fn produce_code(conn: &mut Connection, topic: &str) -> i16 {
    produce_batch(conn, topic, 0, batch(1, 1_000)).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_asks_the_acls_and_refuses_with_kafka_s_errors() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path().to_path_buf(), |c| {
        c.authorization = Some(AuthorizationSettings {
            super_users: Vec::new(),
            allow_everyone_if_no_acl_found: true,
        });
    })
    .await;
    let mut conn = broker.connect().await;
    create_topic(&mut conn, "open.nodes", 1).await;
    create_topic(&mut conn, "kiln.nodes", 1).await;
    create_topic(&mut conn, "kiln.secret", 1).await;
    produce(&mut conn, "kiln.nodes", 0, 2).await;

    // kiln.nodes: DESCRIBE only. kiln.secret: everything denied (a prefix deny on "kiln.s").
    use Operation::*;
    use PatternType::*;
    use Permission::*;
    use ResourceType::*;
    for (t, p, name, op, perm) in [
        (Topic, Literal, "kiln.nodes", Describe, Allow),
        (Topic, Prefixed, "kiln.s", All, Deny),
        (Group, Literal, "burnin", Describe, Allow),
        // Once one ACL names the cluster, nothing else is allowed there by default: ALTER
        // (which implies DESCRIBE) first, to keep managing ACLs. Without the deny, CREATE on
        // the cluster would allow any topic.
        (Cluster, Literal, "kafka-cluster", Alter, Allow),
        (Cluster, Literal, "kafka-cluster", Create, Deny),
    ] {
        assert_eq!(create_acl(&mut conn, t, p, name, op, perm).await, 0);
    }

    // Produce: refused where WRITE is not allowed, served where no ACL names the topic.
    let denied = code(ResponseError::TopicAuthorizationFailed);
    assert_eq!(produce_code(&mut conn, "kiln.nodes").await, denied);
    assert_eq!(produce_code(&mut conn, "kiln.secret").await, denied);
    assert_eq!(produce_code(&mut conn, "open.nodes").await, 0);
    // A produce naming an allowed and a refused topic: one written, one refused.
    let both = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(
            ["open.nodes", "kiln.secret"]
                .iter()
                .map(|t| {
                    produce_request::TopicProduceData::default()
                        .with_name(topic_name(t))
                        .with_partition_data(vec![produce_request::PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(batch(1, 1_000)))])
                })
                .collect(),
        );
    let ResponseKind::Produce(r) = conn.call(RequestKind::Produce(both), T).await.unwrap() else {
        panic!("Produce")
    };
    let codes: Vec<(String, i16)> = r
        .responses
        .iter()
        .map(|t| (t.name.to_string(), t.partition_responses[0].error_code))
        .collect();
    assert_eq!(
        codes,
        vec![("open.nodes".into(), 0), ("kiln.secret".into(), denied)]
    );

    // Metadata: the listing leaves kiln.secret out; asked by name it (and a topic that does
    // not exist under the denied prefix) is TOPIC_AUTHORIZATION_FAILED.
    let listed = metadata(&mut conn, None).await;
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.contains(&"kiln.nodes") && names.contains(&"open.nodes"),
        "{names:?}"
    );
    assert!(!names.contains(&"kiln.secret"), "{names:?}");
    let mut named = metadata(
        &mut conn,
        Some(&["kiln.secret", "kiln.sx-missing", "kiln.nodes"]),
    )
    .await;
    named.sort();
    assert_eq!(
        named,
        vec![
            ("kiln.nodes".into(), 0),
            ("kiln.secret".into(), denied),
            ("kiln.sx-missing".into(), denied),
        ]
    );

    // Topic administration on the denied prefix.
    assert_eq!(try_create_topic(&mut conn, "kiln.snew", 1, 1).await, denied);
    let delete = DeleteTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topic_names(vec![topic_name("kiln.secret")]);
    let ResponseKind::DeleteTopics(r) = conn
        .call(RequestKind::DeleteTopics(delete), T)
        .await
        .unwrap()
    else {
        panic!("DeleteTopics")
    };
    assert_eq!(r.responses[0].error_code, denied);
    let configs = DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(s("kiln.secret")),
        DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(s("open.nodes")),
    ]);
    let ResponseKind::DescribeConfigs(r) = conn
        .call(RequestKind::DescribeConfigs(configs), T)
        .await
        .unwrap()
    else {
        panic!("DescribeConfigs")
    };
    let codes: Vec<(String, i16)> = r
        .results
        .iter()
        .map(|c| (c.resource_name.to_string(), c.error_code))
        .collect();
    assert_eq!(
        codes,
        vec![("open.nodes".into(), 0), ("kiln.secret".into(), denied)]
    );

    // Both alter-configs APIs: refused on the denied topic, served on the open one.
    let alter = IncrementalAlterConfigsRequest::default().with_resources(
        ["kiln.secret", "open.nodes"]
            .iter()
            .map(|t| {
                incremental_alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(t))
                    .with_configs(vec![
                        incremental_alter_configs_request::AlterableConfig::default()
                            .with_name(s("retention.ms"))
                            .with_config_operation(0)
                            .with_value(Some(s("3600000"))),
                    ])
            })
            .collect(),
    );
    let ResponseKind::IncrementalAlterConfigs(r) = conn
        .call(RequestKind::IncrementalAlterConfigs(alter), T)
        .await
        .unwrap()
    else {
        panic!("IncrementalAlterConfigs")
    };
    let mut codes: Vec<(String, i16)> = r
        .responses
        .iter()
        .map(|c| (c.resource_name.to_string(), c.error_code))
        .collect();
    codes.sort();
    assert_eq!(
        codes,
        vec![("kiln.secret".into(), denied), ("open.nodes".into(), 0)]
    );
    let alter = AlterConfigsRequest::default().with_resources(vec![
        alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(s("kiln.secret")),
    ]);
    let ResponseKind::AlterConfigs(r) = conn
        .call(RequestKind::AlterConfigs(alter), T)
        .await
        .unwrap()
    else {
        panic!("AlterConfigs")
    };
    assert_eq!(r.responses[0].error_code, denied);

    // Groups: burnin allows DESCRIBE only, so joining it is GROUP_AUTHORIZATION_FAILED and
    // committing for it too; a group nobody named is open.
    let group_denied = code(ResponseError::GroupAuthorizationFailed);
    let joined = join_at(
        &mut conn,
        5,
        join_request("burnin", "", 10_000, 10_000, &["kiln.nodes"]),
    )
    .await;
    assert_eq!(joined.error_code, group_denied);
    let committed = commit(&mut conn, "burnin", -1, "", &[("kiln.nodes", 0, 1, None)]).await;
    assert_eq!(committed, vec![group_denied]);
    // In an open group, committing a topic the client may not read is refused per topic.
    let committed = commit(
        &mut conn,
        "open-group",
        -1,
        "",
        &[("open.nodes", 0, 1, None), ("kiln.nodes", 0, 1, None)],
    )
    .await;
    assert_eq!(committed, vec![0, denied]);
    assert_eq!(describe(&mut conn, "burnin").await.error_code, 0);
    let (_, _, e) = fetch_offset(&mut conn, "open-group", "kiln.nodes", 0).await;
    assert_eq!(
        e, 0,
        "DESCRIBE on kiln.nodes lets the client see its committed offset"
    );
    let (_, _, e) = fetch_offset(&mut conn, "open-group", "kiln.secret", 0).await;
    assert_eq!(e, denied);

    // The client denies itself ALTER on the cluster: it can no longer change ACLs, and every
    // refusal names the cluster.
    assert_eq!(
        create_acl(&mut conn, Cluster, Literal, "kafka-cluster", Alter, Deny).await,
        0
    );
    let cluster_denied = code(ResponseError::ClusterAuthorizationFailed);
    assert_eq!(
        create_acl(&mut conn, Topic, Literal, "x", Read, Allow).await,
        cluster_denied
    );
    let delete = DeleteAclsRequest::default().with_filters(vec![DeleteAclsFilter::default()
        .with_resource_type_filter(1)
        .with_resource_name_filter(None)
        .with_pattern_type_filter(1)
        .with_principal_filter(None)
        .with_host_filter(None)
        .with_operation(1)
        .with_permission_type(1)]);
    let ResponseKind::DeleteAcls(r) = conn.call(RequestKind::DeleteAcls(delete), T).await.unwrap()
    else {
        panic!("DeleteAcls")
    };
    assert_eq!(r.filter_results[0].error_code, cluster_denied);
    // Electing leaders needs ALTER on the cluster: refused as a whole and per partition.
    let elect = ElectLeadersRequest::default()
        .with_election_type(0)
        .with_timeout_ms(5000)
        .with_topic_partitions(Some(vec![
            kafka_protocol::messages::elect_leaders_request::TopicPartitions::default()
                .with_topic(TopicName(
                    kafka_protocol::protocol::StrBytes::from_static_str("open.nodes"),
                ))
                .with_partitions(vec![0]),
        ]));
    let ResponseKind::ElectLeaders(r) = conn
        .call(RequestKind::ElectLeaders(elect), T)
        .await
        .unwrap()
    else {
        panic!("ElectLeaders")
    };
    assert_eq!(r.error_code, cluster_denied);
    assert_eq!(
        r.replica_election_results[0].partition_result[0].error_code,
        cluster_denied
    );
    // DESCRIBE on the cluster is still allowed (ALTER's ALLOW implies it; only ALTER is
    // denied): six bindings.
    let describe_all = describe_filter(1);
    let ResponseKind::DescribeAcls(r) = conn
        .call(RequestKind::DescribeAcls(describe_all), T)
        .await
        .unwrap()
    else {
        panic!("DescribeAcls")
    };
    assert_eq!(r.error_code, 0);
    let count: usize = r.resources.iter().map(|res| res.acls.len()).sum();
    assert_eq!(count, 6, "{r:?}");
    drop(conn);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_survive_a_restart_and_bad_bindings_are_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let tweak = |c: &mut kiln_broker::BrokerConfig| {
        c.authorization = Some(AuthorizationSettings {
            super_users: vec![ANONYMOUS.into()],
            allow_everyone_if_no_acl_found: false,
        });
    };
    let broker = start(dir.path().to_path_buf(), tweak).await;
    let mut conn = broker.connect().await;
    use Operation::*;
    use PatternType::*;
    use Permission::*;
    use ResourceType::*;
    assert_eq!(
        create_acl(&mut conn, Topic, Prefixed, "kiln.", Write, Allow).await,
        0
    );
    // A group cannot be written; a cluster has one name; prefixed "*" is refused.
    let invalid = code(ResponseError::InvalidRequest);
    assert_eq!(
        create_acl(&mut conn, Group, Literal, "g", Write, Allow).await,
        invalid
    );
    assert_eq!(
        create_acl(&mut conn, Cluster, Literal, "c", Alter, Allow).await,
        invalid
    );
    assert_eq!(
        create_acl(&mut conn, Topic, Prefixed, "*", Read, Allow).await,
        invalid
    );
    drop(conn);
    let dir_path = broker.stop().await;

    let broker = start(dir_path, tweak).await;
    let mut conn = broker.connect().await;
    let describe_all = describe_filter(ResourceType::Topic.code());
    let ResponseKind::DescribeAcls(r) = conn
        .call(RequestKind::DescribeAcls(describe_all), T)
        .await
        .unwrap()
    else {
        panic!("DescribeAcls")
    };
    assert_eq!(r.resources.len(), 1, "{r:?}");
    assert_eq!(r.resources[0].resource_name.as_str(), "kiln.");
    assert_eq!(r.resources[0].pattern_type, Prefixed.code());
    drop(conn);
    broker.stop().await;
}
