//! The cluster metadata log: the cluster id, topic creations and deletions, one JSON record
//! each, in the replicated `__cluster_metadata` group. Like KRaft, the metadata is itself a
//! Kafka-format log: the controller (that group's leader) appends, every broker applies the
//! committed records in order to a [`MetadataTable`], so every broker ends up with the same
//! topics and the same replica assignments. The table is the group's snapshot, so the log
//! behind it is purged (docs/replication.md, "Compaction of internal logs").

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// The cluster's id, proposed once by the first controller; the first one applied wins.
    InitCluster {
        cluster_id: String,
    },
    CreateTopic {
        name: String,
        id: Uuid,
        overrides: BTreeMap<String, String>,
        /// Per partition, the broker ids holding a replica, the preferred leader first.
        assignments: Vec<Vec<i32>>,
    },
    DeleteTopic {
        name: String,
        id: Uuid,
    },
    /// A broker's data-directory incarnation (`cluster/join.rs`); the first one applied for a
    /// node id wins.
    RegisterBroker {
        node: i32,
        incarnation: u64,
        /// Where a broker that joined after the cluster was founded listens (`[cluster] join`;
        /// `cluster/membership.rs`). Founding brokers are found in every broker's config.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        addresses: Option<BrokerAddresses>,
    },
    /// A replica move begins (`cluster/moves.rs`): group `group` (a partition's, or an
    /// internal group's) is to have `target` as its voters, the preferred leader first. At
    /// most one move per group at a time.
    StartMove {
        group: String,
        target: Vec<i32>,
    },
    /// A move under way is called off (`cluster/moves.rs`): partition group `group`'s
    /// target becomes its replicas before the move, and the brokers of the abandoned target
    /// keep their replica (they may be voters) until the move back ends.
    CancelMove {
        group: String,
    },
    /// A move ended: group `group`'s voters are `replicas` (committed in its own log).
    FinishMove {
        group: String,
        replicas: Vec<i32>,
    },
    /// Broker `node` is leaving: the controller moves every replica it holds elsewhere, then
    /// removes it (`RemoveBroker`).
    Decommission {
        node: i32,
    },
    /// Broker `node` holds no replica any more and is no longer a member: it is not listed to
    /// clients, and peers refuse its connections.
    RemoveBroker {
        node: i32,
    },
    /// The next `count` producer ids go to broker `node` (`cluster/producer_ids.rs`).
    AllocateProducerIds {
        node: i32,
        count: u32,
    },
    /// Broker `node`, in its run `boot`, has applied the metadata log up to here once it applies
    /// this (`cluster/fence.rs`): until then it may not tell a client a topic does not exist.
    Fence {
        node: i32,
        boot: u64,
    },
    /// A topic's overrides are now exactly `overrides` (IncrementalAlterConfigs, AlterConfigs;
    /// the controller computed and validated the whole set). Every broker applies the new
    /// settings to the replicas it holds.
    AlterTopicConfig {
        name: String,
        id: Uuid,
        overrides: BTreeMap<String, String>,
    },
    /// CreatePartitions: the topic, which has `from` partitions, gains one per assignment.
    AddPartitions {
        name: String,
        id: Uuid,
        from: u32,
        assignments: Vec<Vec<i32>>,
    },
    /// A user's SCRAM credential for one mechanism is now `credential` (`None`: removed).
    /// `if_absent`: applied only when the user has none for that mechanism (the configured
    /// bootstrap user, proposed by every controller that finds it missing).
    ScramCredential {
        user: String,
        mechanism: kiln_sasl::Mechanism,
        credential: Option<kiln_sasl::ScramCredential>,
        if_absent: bool,
    },
    /// The secret every broker derives unknown users' decoy salts from (`cluster/users.rs`),
    /// hex; the first one applied wins.
    ScramDecoySecret {
        secret: String,
    },
    /// CreateAcls and DeleteAcls (`cluster/acls.rs`): these bindings are added and these
    /// removed, validated by the controller that proposed them.
    Acls {
        create: Vec<kiln_acl::Binding>,
        delete: Vec<kiln_acl::Binding>,
    },
}

/// One RecordBatch v2 holding `command` as its only record.
pub fn encode(command: &Command, now_ms: i64) -> Result<Bytes, String> {
    let value = serde_json::to_vec(command).map_err(|e| e.to_string())?;
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
        timestamp: now_ms,
        key: None,
        value: Some(Bytes::from(value)),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        std::iter::once(&record),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("encoding a metadata record: {e}"))?;
    Ok(buf.freeze())
}

/// Every record of one or more batches read from the metadata log, with its offset. A record
/// that does not parse is returned as an error (logged and skipped by the applier: the log is
/// written only by controllers, so this means a newer version wrote it).
pub fn decode(mut batches: Bytes) -> Vec<(i64, Result<Command, String>)> {
    let mut out = Vec::new();
    while !batches.is_empty() {
        match RecordBatchDecoder::decode(&mut batches) {
            Ok(set) => {
                for record in set.records {
                    let parsed = record
                        .value
                        .as_deref()
                        .ok_or_else(|| "metadata record without a value".to_string())
                        .and_then(|v| serde_json::from_slice(v).map_err(|e| e.to_string()));
                    out.push((record.offset, parsed));
                }
            }
            Err(e) => {
                out.push((-1, Err(format!("undecodable metadata batch: {e}"))));
                break;
            }
        }
    }
    out
}

/// A topic as the metadata log defines it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicRecord {
    pub id: Uuid,
    pub overrides: BTreeMap<String, String>,
    pub assignments: Vec<Vec<i32>>,
    /// Partitions whose replicas were ever moved: a replica of one of them that finds its
    /// directory empty was added by a move (or lost its disk) and must never start the group
    /// anew; it waits for the leader to fill it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub moved: std::collections::BTreeSet<u32>,
}

/// Where a broker that joined the cluster listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerAddresses {
    /// `host:port` Kafka clients use.
    pub kafka: String,
    /// `host:port` of its Raft listener.
    pub raft: String,
    /// Its advertised address on each of `[[listeners]]`, by name.
    #[serde(default)]
    pub listeners: BTreeMap<String, String>,
}

/// What the metadata log says, as of some applied position.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataState {
    pub cluster_id: Option<String>,
    pub topics: BTreeMap<String, TopicRecord>,
    /// Each broker's registered data-directory incarnation, by node id.
    #[serde(default)]
    pub brokers: BTreeMap<i32, u64>,
    /// The first producer id not yet given to any broker.
    #[serde(default)]
    pub next_producer_id: i64,
    /// Each broker's latest block of producer ids: (first id, count).
    #[serde(default)]
    pub producer_id_blocks: BTreeMap<i32, (i64, u32)>,
    /// Each broker's latest fence: the run (`boot`) that proposed it (`cluster/fence.rs`).
    #[serde(default)]
    pub fences: BTreeMap<i32, u64>,
    /// SCRAM credentials by user and mechanism (`cluster/users.rs`): salted and hashed, never
    /// a password.
    #[serde(default)]
    pub scram: BTreeMap<String, BTreeMap<kiln_sasl::Mechanism, kiln_sasl::ScramCredential>>,
    /// Hex of the cluster's SCRAM decoy secret, once a controller with `[sasl]` drew it.
    #[serde(default)]
    pub scram_decoy_secret: Option<String>,
    /// The cluster's ACLs (`cluster/acls.rs`).
    #[serde(default)]
    pub acls: kiln_acl::Acls,
    /// Brokers that joined after the cluster was founded, with their addresses.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub joined: BTreeMap<i32, BrokerAddresses>,
    /// Replica moves under way: each group's target voters (`cluster/moves.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub moves: BTreeMap<String, Vec<i32>>,
    /// Moves called off and not yet ended: each group's abandoned target, whose brokers keep
    /// their replica until the group's voters are back (`cluster/moves.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cancelled: BTreeMap<String, Vec<i32>>,
    /// The voters of an internal group (metadata, offsets) once a move changed them; absent,
    /// the founding brokers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub internal: BTreeMap<String, Vec<i32>>,
    /// Brokers being decommissioned.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub leaving: std::collections::BTreeSet<i32>,
    /// Brokers removed from the cluster for good.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub removed: std::collections::BTreeSet<i32>,
    /// The Kafka offset after the last applied record: the controller waits for its own
    /// commands to pass it.
    pub applied_offset: i64,
}

/// The metadata group's state machine table (see the module docs). Each applied change is
/// published on a watch, which the broker's reconciler follows to open and stop replicas.
pub struct MetadataTable {
    state: Mutex<MetadataState>,
    changes: watch::Sender<MetadataState>,
    /// Records that did not parse (written by a newer version): logged and skipped.
    skipped: Mutex<u64>,
}

impl Default for MetadataTable {
    fn default() -> Self {
        MetadataTable {
            state: Mutex::new(MetadataState::default()),
            changes: watch::channel(MetadataState::default()).0,
            skipped: Mutex::new(0),
        }
    }
}

impl MetadataTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, MetadataState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> MetadataState {
        self.lock().clone()
    }

    /// The target of group `group`'s move under way, if one is (a driver waiting for a
    /// learner asks every 100 ms; `state()` would copy every topic).
    pub fn move_target(&self, group: &str) -> Option<Vec<i32>> {
        self.lock().moves.get(group).cloned()
    }

    /// One user's credential for one mechanism (a login looks up only this; `state()` would
    /// copy every topic).
    pub fn scram_credential(
        &self,
        user: &str,
        mechanism: kiln_sasl::Mechanism,
    ) -> Option<kiln_sasl::ScramCredential> {
        self.lock().scram.get(user)?.get(&mechanism).cloned()
    }

    /// The ACL decision for `request` (the lock is held for one scan of the bindings; `state()`
    /// would copy every topic on every request).
    pub fn authorize(&self, request: kiln_acl::Request<'_>, allow_everyone: bool) -> bool {
        self.lock().acls.authorize(request, allow_everyone)
    }

    /// `Acls::authorize_any` on the applied bindings.
    pub fn authorize_any(
        &self,
        principal: &str,
        host: &str,
        operation: kiln_acl::Operation,
        resource_type: kiln_acl::ResourceType,
    ) -> bool {
        self.lock()
            .acls
            .authorize_any(principal, host, operation, resource_type)
    }

    /// The brokers being decommissioned (`state()` would copy every topic; the learner task
    /// asks every second).
    pub fn leaving(&self) -> std::collections::BTreeSet<i32> {
        self.lock().leaving.clone()
    }

    /// The bindings `filter` selects.
    pub fn acls_matching(&self, filter: &kiln_acl::Filter) -> Vec<kiln_acl::Binding> {
        self.lock().acls.matching(filter).cloned().collect()
    }

    /// How many bindings the cluster holds.
    pub fn acl_count(&self) -> usize {
        self.lock().acls.len()
    }

    /// The cluster's SCRAM decoy secret, once applied.
    pub fn scram_decoy_secret(&self) -> Option<String> {
        self.lock().scram_decoy_secret.clone()
    }

    /// Every user with the mechanisms and iteration counts of their credentials.
    pub fn scram_users(&self) -> BTreeMap<String, Vec<(kiln_sasl::Mechanism, u32)>> {
        self.lock()
            .scram
            .iter()
            .map(|(user, m)| {
                let list = m.iter().map(|(m, c)| (*m, c.iterations)).collect();
                (user.clone(), list)
            })
            .collect()
    }

    pub fn subscribe(&self) -> watch::Receiver<MetadataState> {
        self.changes.subscribe()
    }

    fn publish(&self, state: &MetadataState) {
        self.changes.send_replace(state.clone());
    }
}

fn apply_command(state: &mut MetadataState, command: Command) {
    match command {
        Command::InitCluster { cluster_id } => {
            if state.cluster_id.is_none() {
                tracing::info!(%cluster_id, "cluster id");
                state.cluster_id = Some(cluster_id);
            }
        }
        Command::CreateTopic {
            name,
            id,
            overrides,
            assignments,
        } => {
            if state.topics.contains_key(&name) {
                return;
            }
            state.topics.insert(
                name,
                TopicRecord {
                    id,
                    overrides,
                    assignments,
                    moved: Default::default(),
                },
            );
        }
        Command::DeleteTopic { name, id } => {
            if state.topics.get(&name).is_some_and(|t| t.id == id) {
                state.topics.remove(&name);
                let prefix = format!("{id}/");
                state.moves.retain(|group, _| !group.starts_with(&prefix));
                state.cancelled.retain(|group, _| !group.starts_with(&prefix));
            }
        }
        Command::RegisterBroker {
            node,
            incarnation,
            addresses,
        } => match state.brokers.get(&node) {
            None if state.removed.contains(&node) => tracing::error!(
                node,
                "a removed broker asked to register again; refused (give the new broker a new node id)"
            ),
            None => {
                tracing::info!(
                    node,
                    incarnation = format!("{incarnation:016x}"),
                    ?addresses,
                    "broker registered"
                );
                state.brokers.insert(node, incarnation);
                if let Some(a) = addresses {
                    state.joined.insert(node, a);
                }
            }
            Some(&registered) if registered != incarnation => tracing::error!(
                node,
                registered = format!("{registered:016x}"),
                offered = format!("{incarnation:016x}"),
                "a broker offered a second incarnation for its node id; keeping the first"
            ),
            Some(_) => {}
        },
        Command::AlterTopicConfig {
            name,
            id,
            overrides,
        } => match state.topics.get_mut(&name) {
            Some(t) if t.id == id => t.overrides = overrides,
            _ => tracing::info!(topic = %name, "config change for a topic that is gone; ignored"),
        },
        Command::AddPartitions {
            name,
            id,
            from,
            assignments,
        } => match state.topics.get_mut(&name) {
            // `from` makes a second proposal of the same change (a retried request) a no-op.
            Some(t) if t.id == id && t.assignments.len() == from as usize => {
                t.assignments.extend(assignments)
            }
            _ => {
                tracing::warn!(topic = %name, from, "partitions added to a topic that changed or is gone; ignored")
            }
        },
        Command::AllocateProducerIds { node, count } => {
            let first = state.next_producer_id;
            match first.checked_add(i64::from(count)) {
                Some(next) if count > 0 => {
                    state.next_producer_id = next;
                    state.producer_id_blocks.insert(node, (first, count));
                }
                _ => tracing::error!(
                    node,
                    count,
                    first,
                    "a producer id block that does not fit; ignored"
                ),
            }
        }
        Command::Fence { node, boot } => {
            state.fences.insert(node, boot);
        }
        Command::StartMove { group, target } => {
            match state.moves.entry(group) {
                std::collections::btree_map::Entry::Occupied(e) => {
                    tracing::warn!(group = %e.key(), "a second move of a group under way; ignored")
                }
                std::collections::btree_map::Entry::Vacant(e) => {
                    tracing::info!(group = %e.key(), ?target, "replica move started");
                    e.insert(target);
                }
            }
        }
        Command::CancelMove { group } => {
            let original = state.topics.values().find_map(|t| {
                let index = super::moves::partition_of(&group, t.id)?;
                t.assignments.get(index as usize).cloned()
            });
            let (Some(target), Some(original)) = (state.moves.get_mut(&group), original) else {
                // The controller checks before proposing: the move ended, or its topic went,
                // in between.
                tracing::info!(%group, "a cancel of a move that is not under way; ignored");
                return;
            };
            if *target == original {
                // Cancelled already.
                return;
            }
            tracing::info!(%group, abandoned = ?target, back_to = ?original, "replica move cancelled");
            let abandoned = std::mem::replace(target, original);
            state.cancelled.entry(group).or_insert(abandoned);
        }
        Command::FinishMove { group, replicas } => {
            if state.moves.get(&group) != Some(&replicas) {
                // A retried proposal of a move already finished, or a move to a target that
                // was cancelled since (its group's voters are being changed back).
                tracing::info!(%group, ?replicas, "a finish of a move not under way to these replicas; ignored");
                return;
            }
            state.moves.remove(&group);
            state.cancelled.remove(&group);
            tracing::info!(%group, ?replicas, "replica move finished");
            if super::is_internal_group(&group) {
                state.internal.insert(group, replicas);
                return;
            }
            let found = state.topics.values_mut().find_map(|t| {
                let index = super::moves::partition_of(&group, t.id)?;
                Some((t, index))
            });
            match found {
                Some((t, index)) if (index as usize) < t.assignments.len() => {
                    t.assignments[index as usize] = replicas;
                    t.moved.insert(index);
                }
                _ => tracing::info!(%group, "a move of a partition that is gone; ignored"),
            }
        }
        Command::Decommission { node } => {
            if state.removed.contains(&node) {
                return;
            }
            tracing::info!(node, "broker decommissioning");
            state.leaving.insert(node);
        }
        Command::RemoveBroker { node } => {
            tracing::info!(node, "broker removed from the cluster");
            state.leaving.remove(&node);
            state.joined.remove(&node);
            state.removed.insert(node);
        }
        Command::ScramDecoySecret { secret } => {
            if state.scram_decoy_secret.is_none() {
                state.scram_decoy_secret = Some(secret);
            }
        }
        Command::Acls { create, delete } => {
            for b in &delete {
                if state.acls.remove(b) {
                    tracing::info!(acl = %b, "ACL deleted");
                }
            }
            for b in create {
                // The controller validated it; a binding that fails here was written by a
                // newer version and is skipped rather than half-understood.
                match b.validate() {
                    Ok(()) => {
                        tracing::info!(acl = %b, "ACL created");
                        state.acls.insert(b);
                    }
                    Err(e) => {
                        tracing::error!(acl = %b, error = %e, "skipping an ACL that does not validate")
                    }
                }
            }
        }
        Command::ScramCredential {
            user,
            mechanism,
            credential,
            if_absent,
        } => {
            let present = state
                .scram
                .get(&user)
                .is_some_and(|m| m.contains_key(&mechanism));
            match credential {
                Some(_) if if_absent && present => {}
                Some(c) => {
                    tracing::info!(%user, %mechanism, "SCRAM credential set");
                    state.scram.entry(user).or_default().insert(mechanism, c);
                }
                None => {
                    if let Some(m) = state.scram.get_mut(&user) {
                        m.remove(&mechanism);
                        if m.is_empty() {
                            state.scram.remove(&user);
                        }
                        tracing::info!(%user, %mechanism, "SCRAM credential deleted");
                    }
                }
            }
        }
    }
}

impl kiln_raft::Table for MetadataTable {
    fn apply(&self, _index: u64, kafka_offset: i64, batches: &Bytes) {
        let mut state = self.lock();
        let mut end = kafka_offset;
        for (_, parsed) in decode(batches.clone()) {
            end += 1;
            match parsed {
                Ok(c) => apply_command(&mut state, c),
                Err(e) => {
                    *self.skipped.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                    tracing::error!(error = %e, "skipping a metadata record that does not parse");
                }
            }
        }
        state.applied_offset = state.applied_offset.max(end);
        self.publish(&state);
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        serde_json::to_vec(&*self.lock()).map_err(|e| e.to_string())
    }

    fn restore(&self, snapshot: &[u8]) -> Result<(), String> {
        let restored: MetadataState = serde_json::from_slice(snapshot)
            .map_err(|e| format!("metadata snapshot does not parse: {e}"))?;
        let mut state = self.lock();
        *state = restored;
        self.publish(&state);
        Ok(())
    }
}

/// Replica assignment: partition `p` goes to `rf` consecutive brokers starting at
/// `(p + rotation) % n` of the sorted ids, so replicas and preferred leaders are spread evenly
/// and successive topics start on different brokers.
pub fn assign(brokers: &[i32], partitions: u32, rf: usize, rotation: usize) -> Vec<Vec<i32>> {
    let mut ids = brokers.to_vec();
    ids.sort_unstable();
    let n = ids.len().max(1);
    (0..partitions as usize)
        .map(|p| {
            (0..rf.min(ids.len()))
                .map(|i| ids[(p + rotation + i) % n])
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_through_a_record_batch() {
        let create = Command::CreateTopic {
            name: "orders".into(),
            id: Uuid::new_v4(),
            overrides: [("retention.ms".to_string(), "1000".to_string())].into(),
            assignments: vec![vec![1, 2, 3], vec![2, 3, 1]],
        };
        let delete = Command::DeleteTopic {
            name: "orders".into(),
            id: Uuid::new_v4(),
        };
        let mut joined = BytesMut::new();
        joined.extend_from_slice(&encode(&create, 1).expect("encode"));
        joined.extend_from_slice(&encode(&delete, 2).expect("encode"));
        let decoded = decode(joined.freeze());
        assert_eq!(decoded.len(), 2);
        assert_eq!(decoded[0].1.as_ref().ok(), Some(&create));
        assert_eq!(decoded[1].1.as_ref().ok(), Some(&delete));
    }

    #[test]
    fn the_table_applies_commands_and_survives_a_snapshot() {
        use kiln_raft::Table;
        let table = MetadataTable::default();
        let id = Uuid::new_v4();
        let mut joined = BytesMut::new();
        for c in [
            Command::InitCluster {
                cluster_id: "c1".into(),
            },
            Command::InitCluster {
                cluster_id: "c2".into(),
            },
            Command::CreateTopic {
                name: "t".into(),
                id,
                overrides: BTreeMap::new(),
                assignments: vec![vec![1]],
            },
            Command::RegisterBroker {
                node: 2,
                incarnation: 7,
                addresses: None,
            },
            Command::RegisterBroker {
                node: 2,
                incarnation: 8,
                addresses: None,
            },
        ] {
            joined.extend_from_slice(&encode(&c, 0).expect("encode"));
        }
        table.apply(0, 0, &joined.freeze());
        let state = table.state();
        assert_eq!(
            state.cluster_id.as_deref(),
            Some("c1"),
            "the first id applied wins"
        );
        assert_eq!(state.topics["t"].id, id);
        assert_eq!(
            state.brokers[&2], 7,
            "the first incarnation registered wins"
        );
        assert_eq!(state.applied_offset, 5);
        let snap = table.snapshot().expect("snapshot");
        let other = MetadataTable::default();
        other.restore(&snap).expect("restore");
        assert_eq!(other.state(), state);
        let delete = encode(
            &Command::DeleteTopic {
                name: "t".into(),
                id,
            },
            0,
        )
        .expect("encode");
        let mut changes = BytesMut::new();
        for c in [
            Command::AlterTopicConfig {
                name: "t".into(),
                id,
                overrides: [("retention.ms".to_string(), "5".to_string())].into(),
            },
            Command::AddPartitions {
                name: "t".into(),
                id,
                from: 1,
                assignments: vec![vec![1], vec![1]],
            },
            // A retry of the same change: the topic no longer has one partition.
            Command::AddPartitions {
                name: "t".into(),
                id,
                from: 1,
                assignments: vec![vec![1]],
            },
        ] {
            changes.extend_from_slice(&encode(&c, 0).expect("encode"));
        }
        other.apply(1, 5, &changes.freeze());
        let t = &other.state().topics["t"];
        assert_eq!(t.overrides["retention.ms"], "5");
        assert_eq!(t.assignments.len(), 3);
        other.apply(2, 8, &delete);
        assert!(other.state().topics.is_empty());
        assert!(other.restore(b"not json").is_err());
    }

    #[test]
    fn a_cancelled_move_goes_back_and_keeps_the_abandoned_replicas_until_it_ends() {
        use kiln_raft::Table;
        let table = MetadataTable::default();
        let id = Uuid::new_v4();
        let group = super::super::partition_group(id, 0);
        let apply = |index: u64, commands: &[Command]| {
            let mut bytes = BytesMut::new();
            for c in commands {
                bytes.extend_from_slice(&encode(c, 0).expect("encode"));
            }
            table.apply(index, 0, &bytes.freeze());
        };
        apply(
            0,
            &[
                Command::CreateTopic {
                    name: "t".into(),
                    id,
                    overrides: BTreeMap::new(),
                    assignments: vec![vec![1, 2, 3]],
                },
                Command::StartMove {
                    group: group.clone(),
                    target: vec![1, 2, 4],
                },
                Command::CancelMove {
                    group: group.clone(),
                },
            ],
        );
        let state = table.state();
        assert_eq!(state.moves[&group], vec![1, 2, 3]);
        assert_eq!(state.cancelled[&group], vec![1, 2, 4]);
        // Snapshots carry the abandoned target.
        let other = MetadataTable::default();
        other
            .restore(&table.snapshot().expect("snapshot"))
            .expect("restore");
        assert_eq!(other.state(), state);

        apply(
            1,
            &[
                // The old driver finishing the abandoned target: ignored.
                Command::FinishMove {
                    group: group.clone(),
                    replicas: vec![1, 2, 4],
                },
                // Cancelled twice: nothing changes.
                Command::CancelMove {
                    group: group.clone(),
                },
                // A cancel of a group not moving: ignored.
                Command::CancelMove {
                    group: super::super::partition_group(id, 5),
                },
            ],
        );
        assert_eq!(table.state(), {
            let mut s = state.clone();
            s.applied_offset = table.state().applied_offset;
            s
        });
        apply(
            2,
            &[Command::FinishMove {
                group: group.clone(),
                replicas: vec![1, 2, 3],
            }],
        );
        let state = table.state();
        assert!(state.moves.is_empty() && state.cancelled.is_empty());
        assert_eq!(state.topics["t"].assignments, vec![vec![1, 2, 3]]);
    }

    #[test]
    fn moves_and_membership_apply_in_order() {
        use kiln_raft::Table;
        let table = MetadataTable::default();
        let id = Uuid::new_v4();
        let group = super::super::partition_group(id, 1);
        let addresses = BrokerAddresses {
            kafka: "b4:9092".into(),
            raft: "b4:9093".into(),
            listeners: BTreeMap::new(),
        };
        let mut joined = BytesMut::new();
        for c in [
            Command::CreateTopic {
                name: "t".into(),
                id,
                overrides: BTreeMap::new(),
                assignments: vec![vec![1, 2, 3], vec![3, 1, 2]],
            },
            Command::RegisterBroker {
                node: 4,
                incarnation: 9,
                addresses: Some(addresses.clone()),
            },
            Command::Decommission { node: 3 },
            Command::StartMove {
                group: group.clone(),
                target: vec![4, 1, 2],
            },
            // A second move of the same group while the first runs: ignored.
            Command::StartMove {
                group: group.clone(),
                target: vec![1, 2],
            },
            Command::StartMove {
                group: super::super::OFFSETS_GROUP.into(),
                target: vec![1, 2, 4],
            },
        ] {
            joined.extend_from_slice(&encode(&c, 0).expect("encode"));
        }
        table.apply(0, 0, &joined.freeze());
        let state = table.state();
        assert_eq!(state.joined[&4], addresses);
        assert_eq!(state.brokers[&4], 9);
        assert_eq!(state.moves[&group], vec![4, 1, 2]);
        assert!(state.leaving.contains(&3));

        let mut ends = BytesMut::new();
        for c in [
            Command::FinishMove {
                group: group.clone(),
                replicas: vec![4, 1, 2],
            },
            // A retried finish changes nothing.
            Command::FinishMove {
                group: group.clone(),
                replicas: vec![9],
            },
            Command::FinishMove {
                group: super::super::OFFSETS_GROUP.into(),
                replicas: vec![1, 2, 4],
            },
            Command::RemoveBroker { node: 3 },
            // A removed id never registers again.
            Command::RegisterBroker {
                node: 3,
                incarnation: 11,
                addresses: None,
            },
        ] {
            ends.extend_from_slice(&encode(&c, 0).expect("encode"));
        }
        table.apply(1, 6, &ends.freeze());
        let state = table.state();
        let t = &state.topics["t"];
        assert_eq!(t.assignments, vec![vec![1, 2, 3], vec![4, 1, 2]]);
        assert_eq!(t.moved, std::collections::BTreeSet::from([1]));
        assert!(state.moves.is_empty(), "{:?}", state.moves);
        assert!(state.removed.contains(&3) && !state.leaving.contains(&3));
        assert!(!state.brokers.contains_key(&3));
        let snap = table.snapshot().expect("snapshot");
        let other = MetadataTable::default();
        other.restore(&snap).expect("restore");
        assert_eq!(other.state(), state);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let decoded = decode(Bytes::from_static(b"not a record batch at all, clearly"));
        assert!(decoded.iter().all(|(_, r)| r.is_err()), "{decoded:?}");
    }

    #[test]
    fn assignment_spreads_replicas_and_leaders() {
        let a = assign(&[3, 1, 2], 6, 3, 0);
        assert_eq!(a[0], vec![1, 2, 3]);
        assert_eq!(a[1], vec![2, 3, 1]);
        assert_eq!(a[2], vec![3, 1, 2]);
        for id in [1, 2, 3] {
            assert_eq!(
                a.iter().filter(|r| r[0] == id).count(),
                2,
                "leaders of {id}"
            );
        }
        let b = assign(&[1, 2, 3], 2, 2, 1);
        assert_eq!(b, vec![vec![2, 3], vec![3, 1]]);
        assert_eq!(assign(&[1, 2, 3], 1, 5, 0), vec![vec![1, 2, 3]]);
    }
}
