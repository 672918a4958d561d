//! The topic APIs: produce, fetch, offsets, metadata and topic administration.

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kiln_acl::{Operation, ResourceType};

use super::{finish, split, Checked, CLUSTER_DENIED, TOPIC_DENIED};
use crate::authorizer::Access;

fn topic(access: &Access, operation: Operation, name: &str) -> bool {
    access.allows(operation, ResourceType::Topic, name)
}

pub fn produce(access: &Access, mut r: ProduceRequest) -> Checked {
    let (ok, refused) = split(std::mem::take(&mut r.topic_data), |t| {
        topic(access, Operation::Write, &t.name)
    });
    r.topic_data = ok;
    // acks=0 gets no answer at all, so its request is served (emptied) even when nothing is
    // left: the handler then answers nothing.
    let nothing_left = r.topic_data.is_empty() && r.acks != 0;
    let refused: Vec<TopicProduceResponse> = refused
        .into_iter()
        .map(|t| {
            TopicProduceResponse::default()
                .with_name(t.name)
                .with_topic_id(t.topic_id)
                .with_partition_responses(
                    t.partition_data
                        .iter()
                        .map(|p| {
                            PartitionProduceResponse::default()
                                .with_index(p.index)
                                .with_error_code(TOPIC_DENIED.code())
                                .with_base_offset(-1)
                                .with_log_append_time_ms(-1)
                                .with_log_start_offset(-1)
                        })
                        .collect(),
                )
        })
        .collect();
    finish(
        RequestKind::Produce(r),
        nothing_left,
        refused,
        || ResponseKind::Produce(ProduceResponse::default()),
        |response, refused| match response {
            ResponseKind::Produce(mut p) => {
                p.responses.extend(refused);
                ResponseKind::Produce(p)
            }
            other => other,
        },
    )
}

pub fn fetch(access: &Access, mut r: FetchRequest) -> Checked {
    let (ok, refused) = split(std::mem::take(&mut r.topics), |t| {
        topic(access, Operation::Read, &t.topic)
    });
    r.topics = ok;
    let nothing_left = r.topics.is_empty();
    let refused: Vec<FetchableTopicResponse> = refused
        .into_iter()
        .map(|t| {
            FetchableTopicResponse::default()
                .with_topic(t.topic)
                .with_topic_id(t.topic_id)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            PartitionData::default()
                                .with_partition_index(p.partition)
                                .with_error_code(TOPIC_DENIED.code())
                                .with_high_watermark(-1)
                                .with_last_stable_offset(-1)
                                .with_log_start_offset(-1)
                        })
                        .collect(),
                )
        })
        .collect();
    finish(
        RequestKind::Fetch(r),
        nothing_left,
        refused,
        || ResponseKind::Fetch(FetchResponse::default()),
        |response, refused| match response {
            ResponseKind::Fetch(mut f) => {
                f.responses.extend(refused);
                ResponseKind::Fetch(f)
            }
            other => other,
        },
    )
}

pub fn list_offsets(access: &Access, mut r: ListOffsetsRequest) -> Checked {
    let (ok, refused) = split(std::mem::take(&mut r.topics), |t| {
        topic(access, Operation::Describe, &t.name)
    });
    r.topics = ok;
    let nothing_left = r.topics.is_empty();
    let refused: Vec<ListOffsetsTopicResponse> = refused
        .into_iter()
        .map(|t| {
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            ListOffsetsPartitionResponse::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(TOPIC_DENIED.code())
                                .with_timestamp(-1)
                                .with_offset(-1)
                        })
                        .collect(),
                )
        })
        .collect();
    finish(
        RequestKind::ListOffsets(r),
        nothing_left,
        refused,
        || ResponseKind::ListOffsets(ListOffsetsResponse::default()),
        |response, refused| match response {
            ResponseKind::ListOffsets(mut l) => {
                l.topics.extend(refused);
                ResponseKind::ListOffsets(l)
            }
            other => other,
        },
    )
}

/// Metadata: a listing of every topic leaves out those the principal may not describe; a
/// topic asked for by name that it may not describe is answered TOPIC_AUTHORIZATION_FAILED,
/// whether it exists or not. A topic is created on request only with CREATE on the cluster or
/// on every topic asked for.
pub fn metadata(access: &Access, mut r: MetadataRequest) -> Checked {
    let listing_all = r.topics.is_none();
    // Asked quietly: most clients ask for creation on every Metadata request, and a refusal
    // here only means the topic is not created.
    let cluster = kiln_acl::CLUSTER_NAME;
    if r.allow_auto_topic_creation
        && !access.sees(Operation::Create, ResourceType::Cluster, cluster)
    {
        let creatable = r.topics.iter().flatten().all(|t| {
            t.name
                .as_ref()
                .is_some_and(|n| access.sees(Operation::Create, ResourceType::Topic, n))
        });
        r.allow_auto_topic_creation = creatable;
    }
    let access = access.clone();
    let patch: super::Patch = Box::new(move |response| match response {
        ResponseKind::Metadata(mut m) => {
            m.topics = std::mem::take(&mut m.topics)
                .into_iter()
                .filter_map(|t| {
                    let name = t.name.as_ref().map(|n| n.as_str()).unwrap_or("");
                    let seen = if listing_all {
                        access.sees(Operation::Describe, ResourceType::Topic, name)
                    } else {
                        topic(&access, Operation::Describe, name)
                    };
                    if seen {
                        Some(t)
                    } else if listing_all {
                        None
                    } else {
                        Some(
                            MetadataResponseTopic::default()
                                .with_name(t.name)
                                .with_error_code(TOPIC_DENIED.code()),
                        )
                    }
                })
                .collect();
            ResponseKind::Metadata(m)
        }
        other => other,
    });
    Checked::Serve(RequestKind::Metadata(r), Some(patch))
}

pub fn create_topics(access: &Access, mut r: CreateTopicsRequest) -> Checked {
    if access.allows_cluster(Operation::Create) {
        return Checked::Serve(RequestKind::CreateTopics(r), None);
    }
    let (ok, refused) = split(std::mem::take(&mut r.topics), |t| {
        topic(access, Operation::Create, &t.name)
    });
    r.topics = ok;
    let nothing_left = r.topics.is_empty();
    let refused: Vec<CreatableTopicResult> = refused
        .into_iter()
        .map(|t| {
            CreatableTopicResult::default()
                .with_name(t.name)
                .with_error_code(TOPIC_DENIED.code())
                .with_num_partitions(-1)
                .with_replication_factor(-1)
        })
        .collect();
    finish(
        RequestKind::CreateTopics(r),
        nothing_left,
        refused,
        || ResponseKind::CreateTopics(CreateTopicsResponse::default()),
        |response, refused| match response {
            ResponseKind::CreateTopics(mut c) => {
                c.topics.extend(refused);
                ResponseKind::CreateTopics(c)
            }
            other => other,
        },
    )
}

pub fn delete_topics(access: &Access, mut r: DeleteTopicsRequest) -> Checked {
    // v1-v5 name topics in `topic_names`; `topics` (by name or id) is v6+, which Kiln does
    // not serve (kiln_wire::SUPPORTED_APIS).
    let (ok, refused) = split(std::mem::take(&mut r.topic_names), |n| {
        topic(access, Operation::Delete, n)
    });
    r.topic_names = ok;
    let nothing_left = r.topic_names.is_empty() && r.topics.is_empty();
    let refused: Vec<DeletableTopicResult> = refused
        .into_iter()
        .map(|n| {
            DeletableTopicResult::default()
                .with_name(Some(n))
                .with_error_code(TOPIC_DENIED.code())
        })
        .collect();
    finish(
        RequestKind::DeleteTopics(r),
        nothing_left,
        refused,
        || ResponseKind::DeleteTopics(DeleteTopicsResponse::default()),
        |response, refused| match response {
            ResponseKind::DeleteTopics(mut d) => {
                d.responses.extend(refused);
                ResponseKind::DeleteTopics(d)
            }
            other => other,
        },
    )
}

pub fn create_partitions(access: &Access, mut r: CreatePartitionsRequest) -> Checked {
    let (ok, refused) = split(std::mem::take(&mut r.topics), |t| {
        topic(access, Operation::Alter, &t.name)
    });
    r.topics = ok;
    let nothing_left = r.topics.is_empty();
    let refused: Vec<CreatePartitionsTopicResult> = refused
        .into_iter()
        .map(|t| {
            CreatePartitionsTopicResult::default()
                .with_name(t.name)
                .with_error_code(TOPIC_DENIED.code())
        })
        .collect();
    finish(
        RequestKind::CreatePartitions(r),
        nothing_left,
        refused,
        || ResponseKind::CreatePartitions(CreatePartitionsResponse::default()),
        |response, refused| match response {
            ResponseKind::CreatePartitions(mut c) => {
                c.results.extend(refused);
                ResponseKind::CreatePartitions(c)
            }
            other => other,
        },
    )
}

pub fn delete_records(access: &Access, mut r: DeleteRecordsRequest) -> Checked {
    let (ok, refused) = split(std::mem::take(&mut r.topics), |t| {
        topic(access, Operation::Delete, &t.name)
    });
    r.topics = ok;
    let nothing_left = r.topics.is_empty();
    let refused: Vec<DeleteRecordsTopicResult> = refused
        .into_iter()
        .map(|t| {
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            DeleteRecordsPartitionResult::default()
                                .with_partition_index(p.partition_index)
                                .with_low_watermark(-1)
                                .with_error_code(TOPIC_DENIED.code())
                        })
                        .collect(),
                )
        })
        .collect();
    finish(
        RequestKind::DeleteRecords(r),
        nothing_left,
        refused,
        || ResponseKind::DeleteRecords(DeleteRecordsResponse::default()),
        |response, refused| match response {
            ResponseKind::DeleteRecords(mut d) => {
                d.topics.extend(refused);
                ResponseKind::DeleteRecords(d)
            }
            other => other,
        },
    )
}

/// Config resources: a topic (type 2) is checked on the topic, a broker (4) or broker logger
/// (8) on the cluster. Another type passes to the handler, which refuses it.
fn config_resource(
    access: &Access,
    operation: Operation,
    resource_type: i8,
    name: &str,
) -> Option<kafka_protocol::ResponseError> {
    match resource_type {
        2 if !topic(access, operation, name) => Some(TOPIC_DENIED),
        4 | 8 if !access.allows_cluster(operation) => Some(CLUSTER_DENIED),
        _ => None,
    }
}

/// Splits config resources into those allowed and those refused, with each refusal's error.
fn split_resources<T>(
    items: Vec<T>,
    refusal: impl Fn(&T) -> Option<kafka_protocol::ResponseError>,
) -> (Vec<T>, Vec<(T, kafka_protocol::ResponseError)>) {
    let mut ok = Vec::with_capacity(items.len());
    let mut refused = Vec::new();
    for item in items {
        match refusal(&item) {
            None => ok.push(item),
            Some(error) => refused.push((item, error)),
        }
    }
    (ok, refused)
}

pub fn describe_configs(access: &Access, mut r: DescribeConfigsRequest) -> Checked {
    let (ok, refused) = split_resources(std::mem::take(&mut r.resources), |c| {
        config_resource(
            access,
            Operation::DescribeConfigs,
            c.resource_type,
            &c.resource_name,
        )
    });
    r.resources = ok;
    let nothing_left = r.resources.is_empty();
    let refused: Vec<DescribeConfigsResult> = refused
        .into_iter()
        .map(|(c, error)| {
            DescribeConfigsResult::default()
                .with_error_code(error.code())
                .with_error_message(Some(StrBytes::from_static_str("not authorized")))
                .with_resource_type(c.resource_type)
                .with_resource_name(c.resource_name)
        })
        .collect();
    finish(
        RequestKind::DescribeConfigs(r),
        nothing_left,
        refused,
        || ResponseKind::DescribeConfigs(DescribeConfigsResponse::default()),
        |response, refused| match response {
            ResponseKind::DescribeConfigs(mut d) => {
                d.results.extend(refused);
                ResponseKind::DescribeConfigs(d)
            }
            other => other,
        },
    )
}

/// AlterConfigs and IncrementalAlterConfigs: the same check on two request types with the
/// same fields.
macro_rules! alter_configs {
    ($name:ident, $request:ident, $kind:ident, $response:ident, $entry:path) => {
        pub fn $name(access: &Access, mut r: $request) -> Checked {
            use $entry as Entry;
            let (ok, refused) = split_resources(std::mem::take(&mut r.resources), |c| {
                config_resource(
                    access,
                    Operation::AlterConfigs,
                    c.resource_type,
                    &c.resource_name,
                )
            });
            r.resources = ok;
            let nothing_left = r.resources.is_empty();
            let refused: Vec<Entry> = refused
                .into_iter()
                .map(|(c, error)| {
                    Entry::default()
                        .with_error_code(error.code())
                        .with_resource_type(c.resource_type)
                        .with_resource_name(c.resource_name)
                })
                .collect();
            finish(
                RequestKind::$kind(r),
                nothing_left,
                refused,
                || ResponseKind::$kind($response::default()),
                |response, refused| match response {
                    ResponseKind::$kind(mut a) => {
                        a.responses.extend(refused);
                        ResponseKind::$kind(a)
                    }
                    other => other,
                },
            )
        }
    };
}

alter_configs!(
    alter_configs,
    AlterConfigsRequest,
    AlterConfigs,
    AlterConfigsResponse,
    kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse
);
alter_configs!(
    incremental_alter_configs,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigs,
    IncrementalAlterConfigsResponse,
    kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse
);
