//! Every advertised version of every API gets a well-formed answer from a real broker over TCP.
//! (Some kafka-protocol encoders refuse fields a version lacks; this catches a handler that sets one.)
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kiln_broker::{Broker, BrokerConfig};
use kiln_client::Connection;
use kiln_wire::SUPPORTED_APIS;

const T: Duration = Duration::from_secs(10);

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn batch(ts: i64) -> bytes::Bytes {
    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: ts,
        key: Some(bytes::Bytes::from_static(b"k")),
        value: Some(bytes::Bytes::from_static(b"v")),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        [&record],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

fn request(api: ApiKey, version: i16, topic: &str) -> RequestKind {
    match api {
        ApiKey::ApiVersions => RequestKind::ApiVersions(ApiVersionsRequest::default()),
        ApiKey::Metadata => {
            RequestKind::Metadata(MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(name(topic))),
            ])))
        }
        ApiKey::CreateTopics => RequestKind::CreateTopics(
            CreateTopicsRequest::default().with_topics(vec![CreatableTopic::default()
                .with_name(name(&format!("created-v{version}")))
                .with_num_partitions(1)
                .with_replication_factor(1)]),
        ),
        ApiKey::DeleteTopics => RequestKind::DeleteTopics(
            DeleteTopicsRequest::default().with_topic_names(vec![name("absent")]),
        ),
        ApiKey::Produce => RequestKind::Produce(
            ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(5000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(name(topic))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(batch(1000)))])]),
        ),
        ApiKey::Fetch => RequestKind::Fetch(
            FetchRequest::default()
                .with_max_wait_ms(10)
                .with_max_bytes(1 << 20)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(name(topic))
                    .with_partitions(vec![FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(0)
                        .with_partition_max_bytes(1 << 20)])]),
        ),
        ApiKey::ListOffsets => RequestKind::ListOffsets(
            ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(name(topic))
                    .with_partitions(vec![ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(500)])]),
        ),
        ApiKey::InitProducerId => RequestKind::InitProducerId(
            InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        ),
        ApiKey::DescribeConfigs => {
            RequestKind::DescribeConfigs(DescribeConfigsRequest::default().with_resources(vec![
                describe_configs_request::DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_string(topic.to_string()))
                    .with_configuration_keys(None),
            ]))
        }
        ApiKey::AlterConfigs => {
            RequestKind::AlterConfigs(AlterConfigsRequest::default().with_resources(vec![
                alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_string(topic.to_string()))
                    .with_configs(vec![alter_configs_request::AlterableConfig::default()
                        .with_name(StrBytes::from_static_str("retention.ms"))
                        .with_value(Some(StrBytes::from_string(format!(
                            "{}",
                            86_400_000 + version as i64
                        ))))]),
            ]))
        }
        ApiKey::IncrementalAlterConfigs => RequestKind::IncrementalAlterConfigs(
            IncrementalAlterConfigsRequest::default().with_resources(vec![
                incremental_alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_string(topic.to_string()))
                    .with_configs(vec![
                        incremental_alter_configs_request::AlterableConfig::default()
                            .with_name(StrBytes::from_static_str("segment.ms"))
                            .with_config_operation(0)
                            .with_value(Some(StrBytes::from_string(format!(
                                "{}",
                                3_600_000 + version as i64
                            )))),
                    ]),
            ]),
        ),
        // Each version raises the count by one.
        ApiKey::CreatePartitions => RequestKind::CreatePartitions(
            CreatePartitionsRequest::default()
                .with_timeout_ms(5000)
                .with_topics(vec![
                    create_partitions_request::CreatePartitionsTopic::default()
                        .with_name(name(topic))
                        .with_count(i32::from(version) + 2)
                        .with_assignments(None),
                ]),
        ),
        // Each version moves the log start to version + 1.
        ApiKey::DeleteRecords => RequestKind::DeleteRecords(
            DeleteRecordsRequest::default()
                .with_timeout_ms(5000)
                .with_topics(vec![delete_records_request::DeleteRecordsTopic::default()
                    .with_name(name(topic))
                    .with_partitions(vec![
                        delete_records_request::DeleteRecordsPartition::default()
                            .with_partition_index(0)
                            .with_offset(i64::from(version) + 1),
                    ])]),
        ),
        ApiKey::DescribeCluster => RequestKind::DescribeCluster(DescribeClusterRequest::default()),
        // One broker leads every partition and is every partition's preferred replica.
        ApiKey::ElectLeaders => RequestKind::ElectLeaders(
            ElectLeadersRequest::default()
                .with_timeout_ms(5000)
                .with_topic_partitions(Some(vec![
                    elect_leaders_request::TopicPartitions::default()
                        .with_topic(name(topic))
                        .with_partitions(vec![0]),
                ])),
        ),
        // A cancel (no replica list) of a partition not being moved: NO_REASSIGNMENT_IN_PROGRESS
        // for that partition; the others answer as they are.
        ApiKey::AlterPartitionReassignments => RequestKind::AlterPartitionReassignments(
            AlterPartitionReassignmentsRequest::default()
                .with_timeout_ms(5000)
                .with_topics(vec![
                    alter_partition_reassignments_request::ReassignableTopic::default()
                        .with_name(name(topic))
                        .with_partitions(vec![
                            alter_partition_reassignments_request::ReassignablePartition::default()
                                .with_partition_index(0)
                                .with_replicas(None),
                        ]),
                ]),
        ),
        ApiKey::ListPartitionReassignments => RequestKind::ListPartitionReassignments(
            ListPartitionReassignmentsRequest::default().with_timeout_ms(5000),
        ),
        ApiKey::DescribeLogDirs => {
            RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default().with_topics(Some(vec![
                describe_log_dirs_request::DescribableLogDirTopic::default()
                    .with_topic(name(topic))
                    .with_partitions(vec![0]),
            ])))
        }
        // No such broker: BROKER_ID_NOT_REGISTERED.
        ApiKey::UnregisterBroker => RequestKind::UnregisterBroker(
            UnregisterBrokerRequest::default().with_broker_id(BrokerId(99)),
        ),
        // This broker has no [sasl]: both are answered with an error and the connection stays.
        ApiKey::SaslHandshake => RequestKind::SaslHandshake(
            SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        ),
        ApiKey::SaslAuthenticate => {
            RequestKind::SaslAuthenticate(SaslAuthenticateRequest::default())
        }
        ApiKey::DescribeUserScramCredentials => {
            RequestKind::DescribeUserScramCredentials(DescribeUserScramCredentialsRequest::default())
        }
        ApiKey::AlterUserScramCredentials => {
            RequestKind::AlterUserScramCredentials(AlterUserScramCredentialsRequest::default())
        }
        ApiKey::OffsetDelete => RequestKind::OffsetDelete(
            OffsetDeleteRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("absent")))
                .with_topics(vec![
                    offset_delete_request::OffsetDeleteRequestTopic::default()
                        .with_name(name(topic))
                        .with_partitions(vec![
                            offset_delete_request::OffsetDeleteRequestPartition::default()
                                .with_partition_index(0),
                        ]),
                ]),
        ),
        // The broker enforces ACLs with the anonymous client as its super user, so these reach
        // the real handlers (tests/acls.rs checks what they do).
        ApiKey::DescribeAcls => RequestKind::DescribeAcls(
            DescribeAclsRequest::default()
                .with_resource_type_filter(1)
                .with_resource_name_filter(None)
                .with_pattern_type_filter(1)
                .with_principal_filter(None)
                .with_host_filter(None)
                .with_operation(1)
                .with_permission_type(1),
        ),
        ApiKey::CreateAcls => RequestKind::CreateAcls(CreateAclsRequest::default().with_creations(
            vec![create_acls_request::AclCreation::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_string(topic.to_string()))
                .with_resource_pattern_type(3)
                .with_principal(StrBytes::from_static_str("User:agent"))
                .with_host(StrBytes::from_static_str("*"))
                .with_operation(3)
                .with_permission_type(3)],
        )),
        ApiKey::DeleteAcls => RequestKind::DeleteAcls(DeleteAclsRequest::default().with_filters(
            vec![delete_acls_request::DeleteAclsFilter::default()
                .with_resource_type_filter(2)
                .with_resource_name_filter(None)
                .with_pattern_type_filter(1)
                .with_principal_filter(None)
                .with_host_filter(None)
                .with_operation(1)
                .with_permission_type(1)],
        )),
        other => panic!("no sample request for {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_supported_version_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_path_buf(),
        authorization: Some(kiln_broker::config::AuthorizationSettings {
            super_users: vec!["User:ANONYMOUS".into()],
            allow_everyone_if_no_acl_found: false,
        }),
        ..BrokerConfig::default()
    };
    let bound = Broker::bind(config).await.unwrap();
    let address = bound.local_addr().unwrap().to_string();
    let server = tokio::spawn(bound.run(std::future::pending()));
    let mut conn = Connection::connect(&address, T).await.unwrap();
    let created = conn
        .call(request(ApiKey::CreateTopics, 7, "unused"), T)
        .await
        .unwrap();
    assert!(
        matches!(created, ResponseKind::CreateTopics(ref r) if r.topics[0].error_code == 0),
        "{created:?}"
    );
    let topic = "created-v7";

    let mut checked = 0;
    for &(api, min, max) in SUPPORTED_APIS {
        // Group APIs need a group's state to answer meaningfully: groups_every_version.rs covers them.
        if GROUP_APIS.contains(&api) {
            continue;
        }
        for version in min..=max {
            if api == ApiKey::CreateTopics && version == 7 {
                continue; // made the topic above
            }
            let response = conn
                .call_at(version, request(api, version, topic), T)
                .await
                .unwrap_or_else(|e| panic!("{api:?} v{version}: {e}"));
            let ok = match &response {
                ResponseKind::ApiVersions(r) => r.error_code == 0 && !r.api_keys.is_empty(),
                ResponseKind::Metadata(r) => {
                    r.topics.len() == 1 && r.topics[0].error_code == 0 && r.brokers.len() == 1
                }
                ResponseKind::CreateTopics(r) => r.topics[0].error_code == 0,
                ResponseKind::DeleteTopics(r) => {
                    r.responses[0].error_code == ResponseError::UnknownTopicOrPartition.code()
                }
                ResponseKind::Produce(r) => r.responses[0].partition_responses[0].error_code == 0,
                ResponseKind::Fetch(r) => {
                    let p = &r.responses[0].partitions[0];
                    p.error_code == 0
                        && p.high_watermark > 0
                        && p.records.as_ref().is_some_and(|b| !b.is_empty())
                }
                ResponseKind::InitProducerId(r) => r.error_code == 0 && r.producer_id.0 >= 0,
                ResponseKind::ListOffsets(r) => {
                    let p = &r.topics[0].partitions[0];
                    p.error_code == 0 && p.offset == 0
                }
                ResponseKind::DescribeConfigs(r) => {
                    r.results[0].error_code == 0
                        && r.results[0]
                            .configs
                            .iter()
                            .any(|c| c.name.as_str() == "retention.ms")
                }
                ResponseKind::AlterConfigs(r) => r.responses[0].error_code == 0,
                ResponseKind::IncrementalAlterConfigs(r) => r.responses[0].error_code == 0,
                ResponseKind::CreatePartitions(r) => r.results[0].error_code == 0,
                ResponseKind::DeleteRecords(r) => {
                    let p = &r.topics[0].partitions[0];
                    p.error_code == 0 && p.low_watermark == i64::from(version) + 1
                }
                ResponseKind::ElectLeaders(r) => {
                    r.error_code == 0
                        && r.replica_election_results.len() == 1
                        && r.replica_election_results[0].partition_result[0].error_code
                            == ResponseError::ElectionNotNeeded.code()
                }
                ResponseKind::DescribeCluster(r) => {
                    r.error_code == 0 && r.brokers.len() == 1 && !r.cluster_id.is_empty()
                }
                ResponseKind::OffsetDelete(r) => {
                    r.error_code == ResponseError::GroupIdNotFound.code()
                }
                ResponseKind::SaslHandshake(r) => {
                    r.error_code == ResponseError::UnsupportedSaslMechanism.code()
                        && r.mechanisms.is_empty()
                }
                ResponseKind::SaslAuthenticate(r) => {
                    r.error_code == ResponseError::IllegalSaslState.code()
                }
                ResponseKind::DescribeUserScramCredentials(r) => {
                    r.error_code == 0 && r.results.is_empty()
                }
                ResponseKind::AlterUserScramCredentials(r) => r.results.is_empty(),
                ResponseKind::AlterPartitionReassignments(r) => {
                    r.error_code == 0
                        && r.responses[0].partitions[0].error_code
                            == ResponseError::NoReassignmentInProgress.code()
                }
                ResponseKind::ListPartitionReassignments(r) => {
                    r.error_code == 0 && r.topics.is_empty()
                }
                ResponseKind::DescribeLogDirs(r) => {
                    r.error_code == 0
                        && r.results.len() == 1
                        && r.results[0].topics.len() == 1
                        && r.results[0].topics[0].partitions[0].partition_size > 0
                }
                ResponseKind::UnregisterBroker(r) => {
                    r.error_code == ResponseError::BrokerIdNotRegistered.code()
                }
                // Versions run in order: Describe first (nothing yet), then Create, then Delete
                // (which finds the one binding every Create version wrote).
                ResponseKind::DescribeAcls(r) => r.error_code == 0,
                ResponseKind::CreateAcls(r) => r.results.len() == 1 && r.results[0].error_code == 0,
                ResponseKind::DeleteAcls(r) => {
                    r.filter_results.len() == 1 && r.filter_results[0].error_code == 0
                }
                _ => false,
            };
            assert!(ok, "{api:?} v{version}: unexpected {response:?}");
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} versions checked");
    server.abort();
}

use kafka_protocol::ResponseError;

const GROUP_APIS: &[ApiKey] = &[
    ApiKey::FindCoordinator,
    ApiKey::JoinGroup,
    ApiKey::SyncGroup,
    ApiKey::Heartbeat,
    ApiKey::LeaveGroup,
    ApiKey::OffsetCommit,
    ApiKey::OffsetFetch,
    ApiKey::ListGroups,
    ApiKey::DescribeGroups,
    ApiKey::DeleteGroups,
];
