//! Bad input to the group APIs: unknown group and member ids, stale generations, commits for
//! partitions the member does not own, oversize metadata, invalid ids and timeouts, and
//! mutated or random request bodies. Each gets the protocol's error; the broker never dies and
//! no committed offset changes.
#![allow(clippy::unwrap_used)]

mod groups_common;

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use groups_common::*;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kiln_client::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A group "g" with one member owning t/0 and t/1 (of four partitions), in generation 1,
/// with offset 5 committed on t/0.
async fn stable_group(b: &TestBroker) -> (Connection, String) {
    let mut conn = b.connect().await;
    create_topic(&mut conn, "t", 4).await;
    for p in 0..4 {
        produce(&mut conn, "t", p, 10).await;
    }
    let j = join(&mut conn, "g", 10_000, 10_000, &["t"]).await;
    let me = j.member_id.to_string();
    let s = sync(
        &mut conn,
        "g",
        1,
        &me,
        vec![(me.clone(), assignment(&[("t", &[0, 1])]))],
    )
    .await;
    assert_eq!(s.error_code, 0);
    assert_eq!(
        commit(&mut conn, "g", 1, &me, &[("t", 0, 5, Some("ok"))]).await,
        vec![0]
    );
    (conn, me)
}

async fn assert_offset_unchanged(conn: &mut Connection) {
    assert_eq!(
        fetch_offset(conn, "g", "t", 0).await,
        (5, Some("ok".to_string()), 0),
        "committed offset changed"
    );
    for p in 1..4 {
        assert_eq!(
            fetch_offset(conn, "g", "t", p).await.0,
            -1,
            "t/{p} got an offset"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_group_and_member_ids() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let (mut conn, me) = stable_group(&b).await;
    let unknown = ResponseError::UnknownMemberId.code();

    // Unknown group.
    assert_eq!(heartbeat(&mut conn, "nope", 1, &me).await, unknown);
    assert_eq!(
        sync(&mut conn, "nope", 1, &me, vec![]).await.error_code,
        unknown
    );
    assert_eq!(leave(&mut conn, "nope", &me).await, unknown);
    assert_eq!(
        commit(&mut conn, "nope", 1, &me, &[("t", 0, 1, None)]).await,
        vec![unknown]
    );
    let j = join_at(
        &mut conn,
        5,
        join_request("nope", "made-up", 10_000, 10_000, &["t"]),
    )
    .await;
    assert_eq!(
        j.error_code, unknown,
        "joining an unknown group with a made-up id"
    );
    assert_eq!(
        fetch_offset(&mut conn, "nope", "t", 0).await,
        (-1, Some(String::new()), 0)
    );

    // Known group, unknown member.
    assert_eq!(heartbeat(&mut conn, "g", 1, "made-up").await, unknown);
    assert_eq!(
        sync(&mut conn, "g", 1, "made-up", vec![]).await.error_code,
        unknown
    );
    assert_eq!(leave(&mut conn, "g", "made-up").await, unknown);
    assert_eq!(
        commit(&mut conn, "g", 1, "made-up", &[("t", 0, 9, None)]).await,
        vec![unknown]
    );
    let j = join_at(
        &mut conn,
        5,
        join_request("g", "made-up", 10_000, 10_000, &["t"]),
    )
    .await;
    assert_eq!(j.error_code, unknown);
    // An admin-style commit (generation -1, no member id) while the group has members.
    assert_eq!(
        commit(&mut conn, "g", -1, "", &[("t", 0, 0, None)]).await,
        vec![unknown]
    );

    assert_eq!(
        heartbeat(&mut conn, "g", 1, &me).await,
        0,
        "the real member is unaffected"
    );
    assert_offset_unchanged(&mut conn).await;
    assert_alive(&b.address).await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_generation() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let (mut conn, me) = stable_group(&b).await;
    // Rejoin as leader: a new generation.
    let r = join_at(&mut conn, 5, join_request("g", &me, 10_000, 10_000, &["t"])).await;
    assert_eq!(r.generation_id, 2);
    assert_eq!(
        sync(
            &mut conn,
            "g",
            2,
            &me,
            vec![(me.clone(), assignment(&[("t", &[0, 1])]))]
        )
        .await
        .error_code,
        0
    );
    let illegal = ResponseError::IllegalGeneration.code();
    assert_eq!(heartbeat(&mut conn, "g", 1, &me).await, illegal);
    assert_eq!(
        sync(&mut conn, "g", 1, &me, vec![]).await.error_code,
        illegal
    );
    assert_eq!(
        commit(&mut conn, "g", 1, &me, &[("t", 0, 9, None)]).await,
        vec![illegal]
    );
    assert_eq!(
        commit(&mut conn, "g", 7, &me, &[("t", 0, 9, None)]).await,
        vec![illegal],
        "a future generation"
    );
    // Commits to a group that does not exist with a member generation.
    assert_eq!(
        commit(&mut conn, "other", 3, "", &[("t", 0, 9, None)]).await,
        vec![illegal]
    );
    assert_offset_unchanged(&mut conn).await;
    assert_eq!(heartbeat(&mut conn, "g", 2, &me).await, 0);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_for_partitions_not_owned_or_not_there() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let (mut conn, me) = stable_group(&b).await;
    let errors = commit(
        &mut conn,
        "g",
        1,
        &me,
        &[
            ("t", 2, 3, None),      // not assigned to this member
            ("t", 1, 4, Some("x")), // assigned: accepted
            ("t", 9, 1, None),      // no such partition
            ("missing", 0, 1, None),
            ("t", 1, 11, None), // beyond the high watermark (10)
            ("t", 1, -5, None), // negative
        ],
    )
    .await;
    assert_eq!(
        errors,
        vec![
            ResponseError::IllegalGeneration.code(),
            0,
            ResponseError::UnknownTopicOrPartition.code(),
            ResponseError::UnknownTopicOrPartition.code(),
            ResponseError::OffsetOutOfRange.code(),
            ResponseError::OffsetOutOfRange.code(),
        ]
    );
    assert_eq!(fetch_offset(&mut conn, "g", "t", 1).await.0, 4);
    assert_eq!(fetch_offset(&mut conn, "g", "t", 2).await.0, -1);
    assert_eq!(fetch_offset(&mut conn, "g", "t", 0).await.0, 5);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_metadata_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |c| {
        c.offset_metadata_max_bytes = 100
    })
    .await;
    let (mut conn, me) = stable_group(&b).await;
    let big = "m".repeat(101);
    assert_eq!(
        commit(&mut conn, "g", 1, &me, &[("t", 0, 8, Some(big.as_str()))]).await,
        vec![ResponseError::OffsetMetadataTooLarge.code()]
    );
    assert_offset_unchanged(&mut conn).await;
    let fits = "m".repeat(100);
    assert_eq!(
        commit(&mut conn, "g", 1, &me, &[("t", 0, 8, Some(fits.as_str()))]).await,
        vec![0]
    );
    assert_eq!(
        fetch_offset(&mut conn, "g", "t", 0).await,
        (8, Some(fits), 0)
    );
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_ids_timeouts_and_protocols() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |c| c.group_max_size = 2).await;
    let (mut conn, me) = stable_group(&b).await;
    let long = "g".repeat(2000);
    for bad in ["", long.as_str()] {
        let j = join_at(&mut conn, 5, join_request(bad, "", 10_000, 10_000, &["t"])).await;
        assert_eq!(j.error_code, ResponseError::InvalidGroupId.code());
        assert_eq!(
            heartbeat(&mut conn, bad, 1, &me).await,
            ResponseError::InvalidGroupId.code()
        );
        assert_eq!(
            commit(&mut conn, bad, -1, "", &[("t", 0, 1, None)]).await,
            vec![ResponseError::InvalidGroupId.code()]
        );
        let (_, _, e) = fetch_offset(&mut conn, bad, "t", 0).await;
        assert_eq!(e, ResponseError::InvalidGroupId.code());
        assert_eq!(
            describe(&mut conn, bad).await.error_code,
            ResponseError::InvalidGroupId.code()
        );
    }
    for session in [1, 99, 1_800_001, -1] {
        let j = join_at(
            &mut conn,
            5,
            join_request("g2", "", session, 10_000, &["t"]),
        )
        .await;
        assert_eq!(
            j.error_code,
            ResponseError::InvalidSessionTimeout.code(),
            "session {session}"
        );
    }
    let no_protocols = join_request("g2", "", 10_000, 10_000, &["t"]).with_protocols(vec![]);
    assert_eq!(
        join_at(&mut conn, 5, no_protocols).await.error_code,
        ResponseError::InconsistentGroupProtocol.code()
    );
    let empty_type = join_request("g2", "", 10_000, 10_000, &["t"])
        .with_protocol_type(StrBytes::from_static_str(""));
    assert_eq!(
        join_at(&mut conn, 5, empty_type).await.error_code,
        ResponseError::InconsistentGroupProtocol.code()
    );
    // A different protocol type than the group's members use.
    let connect = join_request("g", "", 10_000, 10_000, &["t"])
        .with_protocol_type(StrBytes::from_static_str("connect"));
    assert_eq!(
        join_at(&mut conn, 5, connect).await.error_code,
        ResponseError::InconsistentGroupProtocol.code()
    );
    // No protocol in common with the members.
    let mut other = join_request("g", "", 10_000, 10_000, &["t"]);
    other.protocols[0].name = StrBytes::from_static_str("roundrobin");
    assert_eq!(
        join_at(&mut conn, 5, other).await.error_code,
        ResponseError::InconsistentGroupProtocol.code()
    );
    // group_max_size = 2: one member, one pending id, then full.
    let second = join_at(&mut conn, 5, join_request("g", "", 10_000, 10_000, &["t"])).await;
    assert_eq!(second.error_code, ResponseError::MemberIdRequired.code());
    let third = join_at(&mut conn, 5, join_request("g", "", 10_000, 10_000, &["t"])).await;
    assert_eq!(third.error_code, ResponseError::GroupMaxSizeReached.code());
    // DeleteGroups: not while it has members; unknown groups.
    let req =
        DeleteGroupsRequest::default().with_groups_names(vec![gid("g"), gid("never"), gid("")]);
    let ResponseKind::DeleteGroups(r) = conn.call(RequestKind::DeleteGroups(req), T).await.unwrap()
    else {
        panic!()
    };
    let codes: Vec<i16> = r.results.iter().map(|r| r.error_code).collect();
    assert_eq!(
        codes,
        vec![
            ResponseError::NonEmptyGroup.code(),
            ResponseError::GroupIdNotFound.code(),
            ResponseError::InvalidGroupId.code()
        ]
    );
    assert_offset_unchanged(&mut conn).await;
    assert_alive(&b.address).await;
    b.stop().await;
}

/// A leader whose assignment is not consumer-protocol bytes: delivered as is; ownership cannot be
/// checked, so commits are only checked by member and generation. No crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_assignment_from_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut conn = b.connect().await;
    create_topic(&mut conn, "t", 2).await;
    produce(&mut conn, "t", 0, 3).await;
    let j = join(&mut conn, "g", 10_000, 10_000, &["t"]).await;
    let me = j.member_id.to_string();
    let garbage = Bytes::from_static(&[0, 0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    let s = sync(
        &mut conn,
        "g",
        1,
        &me,
        vec![
            (me.clone(), garbage.clone()),
            ("not-a-member".into(), garbage.clone()),
        ],
    )
    .await;
    assert_eq!((s.error_code, s.assignment.clone()), (0, garbage));
    assert_eq!(
        commit(&mut conn, "g", 1, &me, &[("t", 0, 2, None)]).await,
        vec![0]
    );
    assert_eq!(describe(&mut conn, "g").await.members.len(), 1);
    assert_alive(&b.address).await;
    b.stop().await;
}

/// A member moving its committed offset backwards gets no error, but the higher offset is kept
/// (DESIGN.md invariant 4); only a commit while the group has no members (a reset) moves it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_never_move_an_offset_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let (mut conn, me) = stable_group(&b).await;
    assert_eq!(
        commit(&mut conn, "g", 1, &me, &[("t", 0, 3, Some("older"))]).await,
        vec![0]
    );
    assert_offset_unchanged(&mut conn).await;
    assert_eq!(
        commit(&mut conn, "g", 1, &me, &[("t", 0, 5, Some("same"))]).await,
        vec![0]
    );
    assert_eq!(
        fetch_offset(&mut conn, "g", "t", 0).await.1.as_deref(),
        Some("same"),
        "an equal offset may update metadata"
    );
    assert_eq!(leave(&mut conn, "g", &me).await, 0);
    assert_eq!(
        commit(&mut conn, "g", -1, "", &[("t", 0, 1, None)]).await,
        vec![0],
        "a reset of an empty group"
    );
    assert_eq!(fetch_offset(&mut conn, "g", "t", 0).await.0, 1);
    b.stop().await;
}

/// Encodes a group request as a complete frame (size prefix, header v1/v2, body).
fn frame(api: ApiKey, version: i16, body: &RequestKind) -> Vec<u8> {
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("fuzz")));
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, api.request_header_version(version))
        .unwrap();
    match body {
        RequestKind::JoinGroup(r) => r.encode(&mut buf, version).unwrap(),
        RequestKind::SyncGroup(r) => r.encode(&mut buf, version).unwrap(),
        RequestKind::OffsetCommit(r) => r.encode(&mut buf, version).unwrap(),
        RequestKind::OffsetFetch(r) => r.encode(&mut buf, version).unwrap(),
        RequestKind::LeaveGroup(r) => r.encode(&mut buf, version).unwrap(),
        _ => unreachable!(),
    }
    let mut out = BytesMut::new();
    out.put_i32(buf.len() as i32);
    out.extend_from_slice(&buf);
    out.to_vec()
}

/// Valid group requests with bytes flipped (seeded): whatever decodes goes through the handlers.
/// The broker must answer or hang up, never die, and "g"'s committed offset must not change
/// except through a well-formed commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_group_requests_never_kill_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let (mut conn, me) = stable_group(&b).await;
    let samples: Vec<(ApiKey, i16, RequestKind)> = vec![
        (ApiKey::JoinGroup, 5, RequestKind::JoinGroup(join_request("fuzzgroup", "", 10_000, 10_000, &["t"]))),
        (ApiKey::JoinGroup, 9, RequestKind::JoinGroup(join_request("fuzzgroup", "", 10_000, 10_000, &["t"]))),
        (
            ApiKey::SyncGroup,
            5,
            RequestKind::SyncGroup(SyncGroupRequest::default().with_group_id(gid("fuzzgroup")).with_generation_id(1).with_member_id(s("m"))),
        ),
        (ApiKey::LeaveGroup, 4, RequestKind::LeaveGroup(LeaveGroupRequest::default().with_group_id(gid("fuzzgroup")))),
        (
            ApiKey::OffsetFetch,
            8,
            RequestKind::OffsetFetch(OffsetFetchRequest::default().with_groups(vec![
                kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup::default().with_group_id(gid("fuzzgroup")),
            ])),
        ),
        (
            ApiKey::OffsetCommit,
            8,
            RequestKind::OffsetCommit(
                OffsetCommitRequest::default().with_group_id(gid("fuzzgroup")).with_generation_id_or_member_epoch(-1).with_topics(vec![
                    kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(topic_name("t"))
                        .with_partitions(vec![kafka_protocol::messages::offset_commit_request::OffsetCommitRequestPartition::default()
                            .with_partition_index(3)
                            .with_committed_offset(2)
                            .with_committed_metadata(Some(s("m")))]),
                ]),
            ),
        ),
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut answered = 0;
    let mut closed = 0;
    for round in 0..300 {
        let (api, version, body) = &samples[round % samples.len()];
        let mut bytes = frame(*api, *version, body);
        // Flip 1-4 bytes after the size prefix and the api key/version (those are checked first).
        for _ in 0..(1 + next() % 4) {
            let at = 8 + (next() as usize) % (bytes.len() - 8);
            bytes[at] ^= (next() % 255 + 1) as u8;
        }
        let mut stream = tokio::net::TcpStream::connect(&b.address).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        let mut buf = [0u8; 4];
        match tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf)).await {
            Ok(Ok(_)) => answered += 1,
            Ok(Err(_)) => closed += 1,
            Err(_) => {
                // A JoinGroup that decoded into a valid join waits for its rebalance: fine.
                closed += 1;
            }
        }
    }
    println!("mutated group requests: {answered} answered, {closed} closed or still waiting");
    assert_alive(&b.address).await;
    assert_eq!(heartbeat(&mut conn, "g", 1, &me).await, 0);
    assert_offset_unchanged(&mut conn).await;
    b.stop().await;
}
