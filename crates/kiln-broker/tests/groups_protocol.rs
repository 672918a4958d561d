//! The group coordinator over real TCP: joining (both join flavours), leader and follower,
//! SyncGroup, session and rebalance timeouts, leaving, rebalances that are not needed, offsets
//! across a restart, and every advertised version of every group API.
#![allow(clippy::unwrap_used)]

mod groups_common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use groups_common::*;
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::*;
use kiln_wire::SUPPORTED_APIS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_member_joins_syncs_commits_and_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut conn = b.connect().await;
    create_topic(&mut conn, "t", 2).await;
    produce(&mut conn, "t", 0, 10).await;

    let joined = join(&mut conn, "g", 10_000, 10_000, &["t"]).await;
    assert_eq!(joined.error_code, 0, "{joined:?}");
    assert_eq!(joined.generation_id, 1);
    assert_eq!(joined.leader, joined.member_id, "the only member leads");
    assert_eq!(joined.members.len(), 1);
    assert_eq!(
        joined.protocol_name.as_ref().map(|p| p.as_str()),
        Some("range")
    );
    let me = joined.member_id.to_string();

    let synced = sync(
        &mut conn,
        "g",
        1,
        &me,
        vec![(me.clone(), assignment(&[("t", &[0, 1])]))],
    )
    .await;
    assert_eq!(synced.error_code, 0);
    assert_eq!(synced.assignment, assignment(&[("t", &[0, 1])]));
    assert_eq!(heartbeat(&mut conn, "g", 1, &me).await, 0);
    let d = describe(&mut conn, "g").await;
    assert_eq!(d.group_state.as_str(), "Stable");
    assert_eq!(d.members.len(), 1);

    assert_eq!(
        commit(
            &mut conn,
            "g",
            1,
            &me,
            &[("t", 0, 7, Some("processed up to 6"))]
        )
        .await,
        vec![0]
    );
    let (offset, metadata, error) = fetch_offset(&mut conn, "g", "t", 0).await;
    assert_eq!(
        (offset, metadata.as_deref(), error),
        (7, Some("processed up to 6"), 0)
    );
    let (offset, _, _) = fetch_offset(&mut conn, "g", "t", 1).await;
    assert_eq!(offset, -1, "nothing committed there");

    assert_eq!(leave(&mut conn, "g", &me).await, 0);
    let d = describe(&mut conn, "g").await;
    assert_eq!(d.group_state.as_str(), "Empty");
    assert!(d.members.is_empty());
    assert_eq!(
        heartbeat(&mut conn, "g", 1, &me).await,
        ResponseError::UnknownMemberId.code()
    );
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_v3_needs_no_member_id_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut conn = b.connect().await;
    let r = join_at(&mut conn, 3, join_request("g", "", 10_000, 10_000, &["t"])).await;
    assert_eq!(r.error_code, 0, "{r:?}");
    assert_eq!(r.generation_id, 1);
    assert!(!r.member_id.is_empty());
    let r0 = join_at(&mut conn, 0, join_request("g0", "", 10_000, -1, &["t"])).await;
    assert_eq!(r0.error_code, 0, "v0 (no rebalance timeout): {r0:?}");
    b.stop().await;
}

/// Two members: the leader gets everyone's metadata, the follower nothing; each gets its own
/// part of the leader's assignment; a follower rejoining unchanged does not disturb the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_assigns_and_followers_receive() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut a = b.connect().await;
    let mut c = b.connect().await;
    create_topic(&mut a, "t", 4).await;

    let ja = join(&mut a, "g", 10_000, 5_000, &["t"]).await;
    let ida = ja.member_id.to_string();
    sync(
        &mut a,
        "g",
        1,
        &ida,
        vec![(ida.clone(), assignment(&[("t", &[0, 1, 2, 3])]))],
    )
    .await;

    // The second member's join waits until the first rejoins.
    let first = join_at(&mut c, 5, join_request("g", "", 10_000, 5_000, &["t"])).await;
    let idc = first.member_id.to_string();
    let pending = tokio::spawn(async move {
        let r = join_at(&mut c, 5, join_request("g", &idc, 10_000, 5_000, &["t"])).await;
        (c, r)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        heartbeat(&mut a, "g", 1, &ida).await,
        ResponseError::RebalanceInProgress.code()
    );
    let ra = join_at(&mut a, 5, join_request("g", &ida, 10_000, 5_000, &["t"])).await;
    let (mut c, rc) = pending.await.unwrap();
    let idc = rc.member_id.to_string();
    assert_eq!((ra.generation_id, rc.generation_id), (2, 2));
    assert_eq!(ra.leader.as_str(), ida, "the leader stays the leader");
    assert_eq!(ra.members.len(), 2, "the leader sees every member");
    assert!(rc.members.is_empty(), "followers see none");

    let follower = tokio::spawn(async move {
        let r = sync(&mut c, "g", 2, &idc, vec![]).await;
        (c, idc, r)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let assignments = vec![
        (ida.clone(), assignment(&[("t", &[0, 1])])),
        (rc.member_id.to_string(), assignment(&[("t", &[2, 3])])),
    ];
    let sa = sync(&mut a, "g", 2, &ida, assignments).await;
    let (mut c, idc, sc) = follower.await.unwrap();
    assert_eq!(sa.assignment, assignment(&[("t", &[0, 1])]));
    assert_eq!(sc.assignment, assignment(&[("t", &[2, 3])]));

    // A follower rejoining with the same subscription gets the current generation back.
    let again = join_at(&mut c, 5, join_request("g", &idc, 10_000, 5_000, &["t"])).await;
    assert_eq!((again.error_code, again.generation_id), (0, 2));
    assert_eq!(
        heartbeat(&mut a, "g", 2, &ida).await,
        0,
        "no rebalance was started"
    );
    let d = describe(&mut a, "g").await;
    assert_eq!(d.group_state.as_str(), "Stable");
    assert_eq!(d.members.len(), 2);
    assert!(d.members.iter().all(|m| !m.member_assignment.is_empty()));
    b.stop().await;
}

/// A member that stops heartbeating is removed after its session timeout; the survivor is told
/// to rejoin and gets a new generation on its own. Prints how long it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_member_is_removed_after_its_session_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut a = b.connect().await;
    let mut c = b.connect().await;
    let session_ms = 600;
    let first = join_at(&mut a, 5, join_request("g", "", session_ms, 5_000, &["t"])).await;
    let ida = first.member_id.to_string();
    let first_c = join_at(&mut c, 5, join_request("g", "", session_ms, 5_000, &["t"])).await;
    let idc = first_c.member_id.to_string();
    let ta = tokio::spawn(async move {
        let r = join_at(
            &mut a,
            5,
            join_request("g", &ida, session_ms, 5_000, &["t"]),
        )
        .await;
        (a, r)
    });
    let rc = join_at(
        &mut c,
        5,
        join_request("g", &idc, session_ms, 5_000, &["t"]),
    )
    .await;
    let (mut a, ra) = ta.await.unwrap();
    assert_eq!((ra.generation_id, rc.generation_id), (1, 1));
    let (leader, ida) = (ra.leader.to_string(), ra.member_id.to_string());
    let lconn = if leader == ida { &mut a } else { &mut c };
    let follower = if leader == ida {
        idc.clone()
    } else {
        ida.clone()
    };
    let assignments = vec![
        (leader.clone(), Bytes::new()),
        (follower.clone(), Bytes::new()),
    ];
    let fl = follower.clone();
    // The follower's SyncGroup waits for the leader's.
    let mut fconn = b.connect().await;
    let ft = tokio::spawn(async move { sync(&mut fconn, "g", 1, &fl, vec![]).await });
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(
        sync(lconn, "g", 1, &leader, assignments).await.error_code,
        0
    );
    assert_eq!(ft.await.unwrap().error_code, 0);

    // Only the leader keeps heartbeating; the follower goes silent.
    let silent_since = Instant::now();
    let mut saw_rebalance = None;
    while silent_since.elapsed() < Duration::from_secs(10) {
        let e = heartbeat(lconn, "g", 1, &leader).await;
        if e == ResponseError::RebalanceInProgress.code() {
            saw_rebalance = Some(silent_since.elapsed());
            break;
        }
        assert_eq!(e, 0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let noticed = saw_rebalance.expect("the silent member was never removed");
    let rejoined = join_at(
        lconn,
        5,
        join_request("g", &leader, session_ms, 5_000, &["t"]),
    )
    .await;
    let total = silent_since.elapsed();
    assert_eq!(rejoined.generation_id, 2);
    assert_eq!(rejoined.members.len(), 1, "only the survivor is left");
    println!(
        "silent member noticed after {} ms (session timeout {session_ms} ms); survivor in generation 2 after {} ms",
        noticed.as_millis(),
        total.as_millis()
    );
    assert!(
        noticed >= Duration::from_millis(session_ms as u64),
        "removed before its session timeout: {noticed:?}"
    );
    assert_eq!(
        heartbeat(&mut b.connect().await, "g", 1, &follower).await,
        ResponseError::UnknownMemberId.code()
    );
    b.stop().await;
}

/// A member that does not rejoin within the rebalance timeout is dropped from the new generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_not_rejoining_within_rebalance_timeout_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut a = b.connect().await;
    let ja = join(&mut a, "g", 30_000, 400, &["t"]).await;
    let ida = ja.member_id.to_string();
    sync(&mut a, "g", 1, &ida, vec![(ida.clone(), Bytes::new())]).await;
    // A second member joins; `a` keeps a long session but never rejoins.
    let mut c = b.connect().await;
    let started = Instant::now();
    let rc = join(&mut c, "g", 30_000, 400, &["t"]).await;
    let waited = started.elapsed();
    assert_eq!(rc.error_code, 0, "{rc:?}");
    assert_eq!(rc.generation_id, 2);
    assert_eq!(
        rc.members.len(),
        1,
        "the member that did not rejoin is gone"
    );
    assert_eq!(rc.leader, rc.member_id);
    assert!(
        waited >= Duration::from_millis(350),
        "join phase ended before the rebalance timeout: {waited:?}"
    );
    assert_eq!(
        heartbeat(&mut a, "g", 1, &ida).await,
        ResponseError::UnknownMemberId.code()
    );
    b.stop().await;
}

/// Committed offsets (and their metadata) survive a broker restart; membership does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut conn = b.connect().await;
    create_topic(&mut conn, "t", 3).await;
    for p in 0..3 {
        produce(&mut conn, "t", p, 20).await;
    }
    let j = join(&mut conn, "g", 10_000, 10_000, &["t"]).await;
    let me = j.member_id.to_string();
    sync(
        &mut conn,
        "g",
        1,
        &me,
        vec![(me.clone(), assignment(&[("t", &[0, 1, 2])]))],
    )
    .await;
    for round in 1..=5i64 {
        let errors = commit(
            &mut conn,
            "g",
            1,
            &me,
            &[
                ("t", 0, round, Some("m0")),
                ("t", 1, round * 2, None),
                ("t", 2, round * 3, Some("")),
            ],
        )
        .await;
        assert_eq!(errors, vec![0, 0, 0]);
    }
    drop(conn);
    let dir_path = b.stop().await;
    let b = start(dir_path, |_| {}).await;
    let mut conn = b.connect().await;
    assert_eq!(
        fetch_offset(&mut conn, "g", "t", 0).await,
        (5, Some("m0".into()), 0)
    );
    assert_eq!(
        fetch_offset(&mut conn, "g", "t", 1).await,
        (10, Some(String::new()), 0)
    );
    assert_eq!(
        fetch_offset(&mut conn, "g", "t", 2).await,
        (15, Some(String::new()), 0)
    );
    let d = describe(&mut conn, "g").await;
    assert_eq!(
        d.group_state.as_str(),
        "Empty",
        "members must rejoin after a restart"
    );
    assert_eq!(
        heartbeat(&mut conn, "g", 1, &me).await,
        ResponseError::UnknownMemberId.code()
    );
    b.stop().await;
}

/// FindCoordinator names this broker, one key (v0-3) or many (v4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_coordinator_answers_with_this_broker() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut conn = b.connect().await;
    let port: i32 = b.address.rsplit_once(':').unwrap().1.parse().unwrap();
    for v in 0..=3 {
        let r = conn
            .call_at(
                v,
                RequestKind::FindCoordinator(FindCoordinatorRequest::default().with_key(s("g"))),
                T,
            )
            .await
            .unwrap();
        let ResponseKind::FindCoordinator(r) = r else {
            panic!()
        };
        assert_eq!(
            (r.error_code, r.port, r.host.as_str()),
            (0, port, "127.0.0.1"),
            "v{v}"
        );
    }
    let request =
        FindCoordinatorRequest::default().with_coordinator_keys(vec![s("a"), s(""), s("b")]);
    let ResponseKind::FindCoordinator(r) = conn
        .call_at(4, RequestKind::FindCoordinator(request), T)
        .await
        .unwrap()
    else {
        panic!()
    };
    let codes: Vec<i16> = r.coordinators.iter().map(|c| c.error_code).collect();
    assert_eq!(codes, vec![0, ResponseError::InvalidGroupId.code(), 0]);
    assert!(r
        .coordinators
        .iter()
        .filter(|c| c.error_code == 0)
        .all(|c| c.port == port));
    let txn = FindCoordinatorRequest::default()
        .with_key(s("tx"))
        .with_key_type(1);
    let ResponseKind::FindCoordinator(r) = conn
        .call_at(3, RequestKind::FindCoordinator(txn), T)
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_ne!(r.error_code, 0, "transaction coordinators are not served");
    b.stop().await;
}

/// A sample request for every version of every group API; each must get a well-formed answer
/// (kafka-protocol refuses to encode fields a version lacks, so this catches a handler that
/// sets one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_group_api_version_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut conn = b.connect().await;
    create_topic(&mut conn, "t", 1).await;
    produce(&mut conn, "t", 0, 5).await;
    let mut checked = 0;
    for &(api, min, max) in SUPPORTED_APIS {
        for v in min..=max {
            let group = format!("{api:?}-v{v}");
            let ok = match api {
                ApiKey::FindCoordinator => {
                    let req = if v >= 4 {
                        FindCoordinatorRequest::default().with_coordinator_keys(vec![s(&group)])
                    } else {
                        FindCoordinatorRequest::default().with_key(s(&group))
                    };
                    matches!(conn.call_at(v, RequestKind::FindCoordinator(req), T).await.unwrap(),
                        ResponseKind::FindCoordinator(r) if r.error_code == 0 && r.coordinators.iter().all(|c| c.error_code == 0))
                }
                ApiKey::JoinGroup => {
                    // Join (both flavours), and rejoin as the leader of a stable group.
                    let mut r = join_at(
                        &mut conn,
                        v,
                        join_request(&group, "", 10_000, 10_000, &["t"]),
                    )
                    .await;
                    if r.error_code == ResponseError::MemberIdRequired.code() {
                        r = join_at(
                            &mut conn,
                            v,
                            join_request(&group, r.member_id.as_str(), 10_000, 10_000, &["t"]),
                        )
                        .await;
                    }
                    r.error_code == 0 && r.generation_id == 1 && r.members.len() == 1
                }
                ApiKey::SyncGroup => {
                    let j = join(&mut conn, &group, 10_000, 10_000, &["t"]).await;
                    let req = SyncGroupRequest::default()
                        .with_group_id(gid(&group))
                        .with_generation_id(j.generation_id)
                        .with_member_id(j.member_id.clone())
                        .with_protocol_type(if v >= 5 { Some(s("consumer")) } else { None })
                        .with_protocol_name(if v >= 5 { Some(s("range")) } else { None })
                        .with_assignments(vec![kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment::default()
                            .with_member_id(j.member_id.clone())
                            .with_assignment(assignment(&[("t", &[0])]))]);
                    matches!(conn.call_at(v, RequestKind::SyncGroup(req), T).await.unwrap(),
                        ResponseKind::SyncGroup(r) if r.error_code == 0 && r.assignment == assignment(&[("t", &[0])]))
                }
                ApiKey::Heartbeat => {
                    let req = HeartbeatRequest::default()
                        .with_group_id(gid(&group))
                        .with_member_id(s("nobody"));
                    matches!(conn.call_at(v, RequestKind::Heartbeat(req), T).await.unwrap(),
                        ResponseKind::Heartbeat(r) if r.error_code == ResponseError::UnknownMemberId.code())
                }
                ApiKey::LeaveGroup => {
                    let j = join(&mut conn, &group, 10_000, 10_000, &["t"]).await;
                    let req = if v >= 3 {
                        LeaveGroupRequest::default()
                            .with_group_id(gid(&group))
                            .with_members(vec![
                                MemberIdentity::default().with_member_id(j.member_id.clone())
                            ])
                    } else {
                        LeaveGroupRequest::default()
                            .with_group_id(gid(&group))
                            .with_member_id(j.member_id.clone())
                    };
                    matches!(conn.call_at(v, RequestKind::LeaveGroup(req), T).await.unwrap(),
                        ResponseKind::LeaveGroup(r) if r.error_code == 0 && r.members.iter().all(|m| m.error_code == 0))
                }
                ApiKey::OffsetCommit => {
                    let req = OffsetCommitRequest::default()
                        .with_group_id(gid(&group))
                        .with_generation_id_or_member_epoch(-1)
                        .with_retention_time_ms(-1)
                        .with_topics(vec![OffsetCommitRequestTopic::default()
                            .with_name(topic_name("t"))
                            .with_partitions(vec![OffsetCommitRequestPartition::default()
                                .with_partition_index(0)
                                .with_committed_offset(3)
                                .with_committed_leader_epoch(-1)
                                .with_committed_metadata(Some(s("x")))])]);
                    matches!(conn.call_at(v, RequestKind::OffsetCommit(req), T).await.unwrap(),
                        ResponseKind::OffsetCommit(r) if r.topics[0].partitions[0].error_code == 0)
                        && fetch_offset(&mut conn, &group, "t", 0).await.0 == 3
                }
                ApiKey::OffsetFetch => {
                    assert_eq!(
                        commit(&mut conn, &group, -1, "", &[("t", 0, 4, Some("meta"))]).await,
                        vec![0]
                    );
                    let req = if v >= 8 {
                        OffsetFetchRequest::default().with_groups(vec![
                            OffsetFetchRequestGroup::default()
                                .with_group_id(gid(&group))
                                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                                    .with_name(topic_name("t"))
                                    .with_partition_indexes(vec![0])])),
                        ])
                    } else {
                        OffsetFetchRequest::default()
                            .with_group_id(gid(&group))
                            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                                .with_name(topic_name("t"))
                                .with_partition_indexes(vec![0])]))
                    };
                    match conn
                        .call_at(v, RequestKind::OffsetFetch(req), T)
                        .await
                        .unwrap()
                    {
                        ResponseKind::OffsetFetch(r) if v >= 8 => {
                            let p = &r.groups[0].topics[0].partitions[0];
                            r.groups[0].error_code == 0
                                && p.committed_offset == 4
                                && p.metadata.as_deref() == Some("meta")
                        }
                        ResponseKind::OffsetFetch(r) => {
                            let p = &r.topics[0].partitions[0];
                            r.error_code == 0
                                && p.committed_offset == 4
                                && p.metadata.as_deref() == Some("meta")
                        }
                        _ => false,
                    }
                }
                ApiKey::ListGroups => {
                    let _ = commit(&mut conn, &group, -1, "", &[("t", 0, 1, None)]).await;
                    matches!(conn.call_at(v, RequestKind::ListGroups(ListGroupsRequest::default()), T).await.unwrap(),
                        ResponseKind::ListGroups(r) if r.error_code == 0 && r.groups.iter().any(|g| g.group_id.as_str() == group))
                }
                ApiKey::DescribeGroups => {
                    let j = join(&mut conn, &group, 10_000, 10_000, &["t"]).await;
                    sync(
                        &mut conn,
                        &group,
                        1,
                        j.member_id.as_str(),
                        vec![(j.member_id.to_string(), assignment(&[("t", &[0])]))],
                    )
                    .await;
                    let req = DescribeGroupsRequest::default()
                        .with_groups(vec![gid(&group), gid("never-seen")]);
                    matches!(conn.call_at(v, RequestKind::DescribeGroups(req), T).await.unwrap(),
                        ResponseKind::DescribeGroups(r) if r.groups[0].error_code == 0 && r.groups[0].group_state.as_str() == "Stable"
                            && r.groups[0].members.len() == 1 && r.groups[1].group_state.as_str() == "Dead")
                }
                ApiKey::DeleteGroups => {
                    let _ = commit(&mut conn, &group, -1, "", &[("t", 0, 1, None)]).await;
                    let req = DeleteGroupsRequest::default()
                        .with_groups_names(vec![gid(&group), gid("never-seen")]);
                    matches!(conn.call_at(v, RequestKind::DeleteGroups(req), T).await.unwrap(),
                        ResponseKind::DeleteGroups(r) if r.results[0].error_code == 0
                            && r.results[1].error_code == ResponseError::GroupIdNotFound.code())
                }
                _ => continue,
            };
            assert!(ok, "{api:?} v{v} was not answered as expected");
            checked += 1;
        }
    }
    println!("{checked} group API versions checked");
    assert!(checked >= 50, "only {checked} versions checked");
    assert_alive(&b.address).await;
    b.stop().await;
}
