//! Admin reads over the Kafka protocol for Kiln's tools (`kiln groups`, the dashboard's lag
//! sampler): groups, coordinators, partition leaders, log offsets and committed offsets. Only
//! standard requests are used, so the same code reads Kiln, Apache Kafka and Redpanda.
//!
//! [`Cluster`] keeps one [`Connection`] per address it has talked to (bootstrap, coordinators,
//! leaders) and handles the request shapes that changed between versions: FindCoordinator
//! batches keys from v4, OffsetFetch batches groups from v8.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FindCoordinatorRequest, GroupId, ListGroupsRequest, ListOffsetsRequest,
    MetadataRequest, OffsetFetchRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::{ClientError, Connection};

/// ListOffsets timestamp for the log end (the next offset to be written).
pub const LATEST: i64 = -1;
/// ListOffsets timestamp for the first offset still in the log.
pub const EARLIEST: i64 = -2;

/// Partition -> leader address (`host:port`) for one topic.
pub type Leaders = BTreeMap<i32, String>;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("connecting to {address}")]
    Connect {
        address: String,
        #[source]
        source: ClientError,
    },
    #[error("request to {address}")]
    Request {
        address: String,
        #[source]
        source: ClientError,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("unexpected response to {0:?}")]
    UnexpectedResponse(ApiKey),
    #[error("ListGroups failed: {}", error_name(*.0))]
    ListGroups(i16),
    #[error("cannot find the coordinator of group {group:?}: {}", error_name(*.code))]
    NoCoordinator { group: String, code: i16 },
    #[error("the broker returned no metadata for topic {0:?}")]
    NoMetadata(String),
    #[error("topic {topic:?}: {}", error_name(*.code))]
    Topic { topic: String, code: i16 },
    #[error("OffsetFetch for group {group:?} failed: {}", error_name(*.code))]
    OffsetFetch { group: String, code: i16 },
}

/// A Kafka error code by its protocol name (`UnknownTopicOrPartition`; `Unknown(N)` for a code
/// this codec does not know). Callers pass only non-zero codes; 0 would read `error 0`.
pub fn error_name(code: i16) -> String {
    ResponseError::try_from_code(code).map_or_else(|| format!("error {code}"), |e| format!("{e:?}"))
}

/// A protocol string from a borrowed one (request builders take owned `StrBytes`).
pub fn str_bytes(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// One group as ListGroups reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupListing {
    pub group_id: String,
    /// None where the broker answers ListGroups below v4, which carries no state.
    pub state: Option<String>,
    pub protocol_type: String,
}

/// One partition's entry in an OffsetFetch answer, as the coordinator sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub topic: String,
    pub partition: i32,
    /// -1 where nothing is committed.
    pub offset: i64,
    pub metadata: String,
    /// The partition's error code; 0 for none.
    pub error_code: i16,
}

/// Connections to the bootstrap broker, group coordinators and partition leaders, each opened
/// on first use and kept until a request on it fails.
pub struct Cluster {
    bootstrap: String,
    timeout: Duration,
    security: crate::Security,
    conns: HashMap<String, Connection>,
}

impl Cluster {
    /// Every connect and every request is bounded by `timeout`.
    pub fn new(bootstrap: impl Into<String>, timeout: Duration) -> Self {
        Self {
            bootstrap: bootstrap.into(),
            timeout,
            security: crate::Security::default(),
            conns: HashMap::new(),
        }
    }

    /// Every connection uses TLS and logs in as `security` says.
    pub fn with_security(mut self, security: crate::Security) -> Self {
        self.security = security;
        self
    }

    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    async fn connection(&mut self, address: &str) -> Result<&mut Connection, AdminError> {
        if !self.conns.contains_key(address) {
            let conn = Connection::open(address, self.timeout, &self.security)
                .await
                .map_err(|source| AdminError::Connect {
                    address: address.to_string(),
                    source,
                })?;
            self.conns.insert(address.to_string(), conn);
        }
        self.conns
            .get_mut(address)
            .ok_or_else(|| AdminError::Connect {
                address: address.to_string(),
                source: ClientError::Closed,
            })
    }

    /// One request to `address`. A connection whose request failed is dropped, so the next
    /// call reconnects instead of reading a stale or half-read stream.
    pub async fn call(
        &mut self,
        address: &str,
        body: RequestKind,
    ) -> Result<ResponseKind, AdminError> {
        let timeout = self.timeout;
        let result = self.connection(address).await?.call(body, timeout).await;
        result.map_err(|source| {
            self.conns.remove(address);
            AdminError::Request {
                address: address.to_string(),
                source,
            }
        })
    }

    /// The version of `api` that requests to `address` are sent at.
    pub async fn version(&mut self, address: &str, api: ApiKey) -> Result<i16, AdminError> {
        Ok(self.connection(address).await?.versions().pick(api)?)
    }

    /// Every group the bootstrap broker's cluster knows: each broker lists the groups it
    /// coordinates, so every broker in Metadata is asked and the answers merged. A broker that
    /// cannot be reached is skipped when another one answered (its groups, if any, are missing).
    pub async fn list_groups(&mut self) -> Result<Vec<GroupListing>, AdminError> {
        let bootstrap = self.bootstrap.clone();
        let request = MetadataRequest::default().with_topics(Some(Vec::new()));
        let ResponseKind::Metadata(m) = self
            .call(&bootstrap, RequestKind::Metadata(request))
            .await?
        else {
            return Err(AdminError::UnexpectedResponse(ApiKey::Metadata));
        };
        let mut addresses: Vec<String> = m
            .brokers
            .iter()
            .map(|b| format!("{}:{}", b.host.as_str(), b.port))
            .collect();
        if addresses.len() <= 1 {
            addresses = vec![bootstrap];
        }
        let mut groups: BTreeMap<String, GroupListing> = BTreeMap::new();
        let mut last_error = None;
        let mut answered = false;
        for address in addresses {
            match self.list_groups_at(&address).await {
                Ok(listed) => {
                    answered = true;
                    for g in listed {
                        groups.insert(g.group_id.clone(), g);
                    }
                }
                Err(e) => last_error = Some(e),
            }
        }
        match (answered, last_error) {
            (false, Some(e)) => Err(e),
            _ => Ok(groups.into_values().collect()),
        }
    }

    async fn list_groups_at(&mut self, address: &str) -> Result<Vec<GroupListing>, AdminError> {
        let version = self.version(address, ApiKey::ListGroups).await?;
        let request = RequestKind::ListGroups(ListGroupsRequest::default());
        let ResponseKind::ListGroups(r) = self.call(address, request).await? else {
            return Err(AdminError::UnexpectedResponse(ApiKey::ListGroups));
        };
        if r.error_code != 0 {
            return Err(AdminError::ListGroups(r.error_code));
        }
        Ok(r.groups
            .iter()
            .map(|g| GroupListing {
                group_id: g.group_id.0.to_string(),
                state: (version >= 4).then(|| g.group_state.to_string()),
                protocol_type: g.protocol_type.to_string(),
            })
            .collect())
    }

    /// The address (`host:port`) of `group`'s coordinator.
    pub async fn coordinator(&mut self, group: &str) -> Result<String, AdminError> {
        let bootstrap = self.bootstrap.clone();
        let version = self.version(&bootstrap, ApiKey::FindCoordinator).await?;
        let request = if version >= 4 {
            FindCoordinatorRequest::default().with_coordinator_keys(vec![str_bytes(group)])
        } else {
            FindCoordinatorRequest::default().with_key(str_bytes(group))
        };
        let ResponseKind::FindCoordinator(r) = self
            .call(&bootstrap, RequestKind::FindCoordinator(request))
            .await?
        else {
            return Err(AdminError::UnexpectedResponse(ApiKey::FindCoordinator));
        };
        let (code, host, port) = match r.coordinators.first() {
            Some(c) if version >= 4 => (c.error_code, c.host.to_string(), c.port),
            _ => (r.error_code, r.host.to_string(), r.port),
        };
        if code != 0 {
            return Err(AdminError::NoCoordinator {
                group: group.to_string(),
                code,
            });
        }
        Ok(format!("{host}:{port}"))
    }

    /// Partition leaders of `topics`: per topic its leaders, or the error code the broker
    /// answered for it (an unknown topic is `UnknownTopicOrPartition`, not a failed call).
    /// A leader the broker list does not name is taken to be the bootstrap broker.
    pub async fn metadata<'a>(
        &mut self,
        topics: impl IntoIterator<Item = &'a str>,
    ) -> Result<BTreeMap<String, Result<Leaders, i16>>, AdminError> {
        let bootstrap = self.bootstrap.clone();
        let request = MetadataRequest::default().with_topics(Some(
            topics
                .into_iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(str_bytes(t)))))
                .collect(),
        ));
        let ResponseKind::Metadata(m) = self
            .call(&bootstrap, RequestKind::Metadata(request))
            .await?
        else {
            return Err(AdminError::UnexpectedResponse(ApiKey::Metadata));
        };
        let brokers: HashMap<i32, String> = m
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        let mut out = BTreeMap::new();
        for t in &m.topics {
            let Some(name) = &t.name else { continue };
            let leaders = if t.error_code != 0 {
                Err(t.error_code)
            } else {
                Ok(t.partitions
                    .iter()
                    .map(|p| {
                        let leader = brokers
                            .get(&p.leader_id.0)
                            .cloned()
                            .unwrap_or_else(|| bootstrap.clone());
                        (p.partition_index, leader)
                    })
                    .collect())
            };
            out.insert(name.0.to_string(), leaders);
        }
        Ok(out)
    }

    /// Partition leaders of one topic, which must exist.
    pub async fn leaders(&mut self, topic: &str) -> Result<Leaders, AdminError> {
        match self.metadata([topic]).await?.remove(topic) {
            Some(Ok(leaders)) => Ok(leaders),
            Some(Err(code)) => Err(AdminError::Topic {
                topic: topic.to_string(),
                code,
            }),
            None => Err(AdminError::NoMetadata(topic.to_string())),
        }
    }

    /// ListOffsets at `timestamp` ([`LATEST`], [`EARLIEST`], or Unix milliseconds: the first
    /// offset at or after it, -1 if no record is that late) for `partitions`, each asked of its
    /// leader in `leaders` (topic -> [`Leaders`]); a partition with no known leader is left
    /// out. Per partition: the offset, or the error code its leader answered.
    pub async fn list_offsets(
        &mut self,
        leaders: &BTreeMap<String, Leaders>,
        partitions: &[(String, i32)],
        timestamp: i64,
    ) -> Result<BTreeMap<(String, i32), Result<i64, i16>>, AdminError> {
        let mut by_leader: BTreeMap<&str, BTreeMap<&str, Vec<i32>>> = BTreeMap::new();
        for (topic, p) in partitions {
            let Some(leader) = leaders.get(topic).and_then(|ls| ls.get(p)) else {
                continue;
            };
            by_leader
                .entry(leader)
                .or_default()
                .entry(topic)
                .or_default()
                .push(*p);
        }
        let mut out = BTreeMap::new();
        for (leader, topics) in by_leader {
            let request = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(
                    topics
                        .iter()
                        .map(|(t, ps)| {
                            ListOffsetsTopic::default()
                                .with_name(TopicName(str_bytes(t)))
                                .with_partitions(
                                    ps.iter()
                                        .map(|&p| {
                                            ListOffsetsPartition::default()
                                                .with_partition_index(p)
                                                .with_timestamp(timestamp)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                );
            let ResponseKind::ListOffsets(r) =
                self.call(leader, RequestKind::ListOffsets(request)).await?
            else {
                return Err(AdminError::UnexpectedResponse(ApiKey::ListOffsets));
            };
            for t in &r.topics {
                for p in &t.partitions {
                    let offset = if p.error_code != 0 {
                        Err(p.error_code)
                    } else {
                        Ok(p.offset)
                    };
                    out.insert((t.name.0.to_string(), p.partition_index), offset);
                }
            }
        }
        Ok(out)
    }

    /// The offsets `group` committed, asked of its `coordinator`: for `topics` (topic ->
    /// partitions), or with None every partition the group committed. A group-level error
    /// fails the call; partition errors are left to the caller in
    /// [`CommittedOffset::error_code`].
    pub async fn committed(
        &mut self,
        coordinator: &str,
        group: &str,
        topics: Option<&BTreeMap<String, Vec<i32>>>,
    ) -> Result<Vec<CommittedOffset>, AdminError> {
        let version = self.version(coordinator, ApiKey::OffsetFetch).await?;
        // Topics None (not an empty list) is how the request asks for every partition. The
        // v8+ and the older requests name topics with the same fields in different types.
        macro_rules! wanted {
            ($topic:ty) => {
                topics.map(|ts| {
                    ts.iter()
                        .map(|(t, ps)| {
                            <$topic>::default()
                                .with_name(TopicName(str_bytes(t)))
                                .with_partition_indexes(ps.clone())
                        })
                        .collect()
                })
            };
        }
        let group_id = GroupId(str_bytes(group));
        let request = if version >= 8 {
            OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(group_id)
                .with_topics(wanted!(OffsetFetchRequestTopics))])
        } else {
            OffsetFetchRequest::default()
                .with_group_id(group_id)
                .with_topics(wanted!(OffsetFetchRequestTopic))
        };
        let ResponseKind::OffsetFetch(r) = self
            .call(coordinator, RequestKind::OffsetFetch(request))
            .await?
        else {
            return Err(AdminError::UnexpectedResponse(ApiKey::OffsetFetch));
        };
        let failed = |code: i16| AdminError::OffsetFetch {
            group: group.to_string(),
            code,
        };
        let mut out = Vec::new();
        // The v8+ and the older answers carry the same partition fields in different types.
        macro_rules! collect {
            ($topics:expr) => {
                for t in $topics {
                    out.extend(t.partitions.iter().map(|p| {
                        CommittedOffset {
                            topic: t.name.0.to_string(),
                            partition: p.partition_index,
                            offset: p.committed_offset,
                            metadata: p
                                .metadata
                                .as_ref()
                                .map(|m| m.to_string())
                                .unwrap_or_default(),
                            error_code: p.error_code,
                        }
                    }));
                }
            };
        }
        if version >= 8 {
            for g in &r.groups {
                if g.error_code != 0 {
                    return Err(failed(g.error_code));
                }
                collect!(&g.topics);
            }
        } else {
            if r.error_code != 0 {
                return Err(failed(r.error_code));
            }
            collect!(&r.topics);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn error_names_are_protocol_names() {
        assert_eq!(error_name(3), "UnknownTopicOrPartition");
        assert_eq!(error_name(15), "CoordinatorNotAvailable");
        assert_eq!(error_name(-1), "UnknownServerError");
        assert_eq!(error_name(32_000), "Unknown(32000)");
        assert_eq!(error_name(0), "error 0");
    }

    #[test]
    fn errors_name_the_code() {
        let e = AdminError::NoCoordinator {
            group: "burnin".into(),
            code: 15,
        };
        assert_eq!(
            e.to_string(),
            "cannot find the coordinator of group \"burnin\": CoordinatorNotAvailable"
        );
        let e = AdminError::Topic {
            topic: "kiln.nodes".into(),
            code: 3,
        };
        assert_eq!(
            e.to_string(),
            "topic \"kiln.nodes\": UnknownTopicOrPartition"
        );
        let e = AdminError::UnexpectedResponse(ApiKey::ListGroups);
        assert_eq!(e.to_string(), "unexpected response to ListGroups");
    }

    #[tokio::test]
    async fn an_unreachable_address_is_named() {
        // A port that was free a moment ago: nothing listens there.
        let address = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().to_string()
        };
        let mut cluster = Cluster::new(address.clone(), Duration::from_secs(5));
        let e = cluster.coordinator("burnin").await.unwrap_err();
        assert!(matches!(e, AdminError::Connect { .. }), "{e:?}");
        assert_eq!(e.to_string(), format!("connecting to {address}"));
    }
}
