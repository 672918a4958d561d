//! The APIs and versions Kiln serves. This table is the single source of truth:
//! the ApiVersions response is built from it and every request is checked
//! against it before its body is decoded.

use kafka_protocol::messages::ApiKey;

/// (API, lowest version, highest version). Ranges stop before versions that
/// need features Kiln does not have yet (topic ids in Produce/Fetch requests,
/// tiered storage offsets), and start where RecordBatch v2 is mandatory.
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 5),
    // Consumer groups (classic protocol; docs/consumer-groups.md). OffsetCommit starts at v2
    // and OffsetFetch at v1, the oldest versions the codec has.
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    // Idempotent producers (no transactions).
    (ApiKey::InitProducerId, 0, 4),
    // Admin APIs (docs/protocol.md). DescribeConfigs v0 is not in the codec; clients that
    // know v0 (kafkajs) also speak v1-v2.
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeCluster, 0, 2),
    // Preferred leader elections on demand (KIP-460; docs/replication.md, "Leader balance").
    (ApiKey::ElectLeaders, 0, 2),
    // Moving replicas and decommissioning brokers (KIP-455, KIP-631; docs/replication.md,
    // "Moving replicas").
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::UnregisterBroker, 0, 0),
    (ApiKey::DescribeLogDirs, 1, 4),
    // SASL (docs/security.md). SaslHandshake v0 sends the mechanism's tokens as bare frames
    // without Kafka headers; every current client uses v1 with SaslAuthenticate.
    (ApiKey::SaslHandshake, 1, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    // ACLs (KIP-140; docs/security.md). v0 has no pattern type; every current client sends v1+.
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
];

/// The supported (min, max) for an API, or `None` when Kiln does not serve it.
pub fn supported_versions(api_key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS
        .iter()
        .find(|(key, _, _)| *key == api_key)
        .map(|&(_, min, max)| (min, max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::Message;

    /// Every advertised version must be one the codec can actually read and write.
    #[test]
    fn advertised_versions_are_within_the_codec() {
        for &(key, min, max) in SUPPORTED_APIS {
            let codec = key.valid_versions();
            assert!(min <= max, "{key:?}");
            assert!(
                codec.min <= min && max <= codec.max,
                "{key:?} {min}..{max} outside codec {codec}"
            );
        }
        let _ = kafka_protocol::messages::ApiVersionsRequest::VERSIONS;
    }
}
