"""Consumer groups with librdkafka (confluent-kafka): commit-after-processing across a SIGKILL,
two groups on one topic, reassignment after a member dies (eager and cooperative), metadata
strings, and committed offsets across broker kill -9 (also while the offsets table is snapshotted)."""

from __future__ import annotations

import random
import re
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from groups_helpers import Worker, committed, produce_numbered, start_group_broker
from kiln_testlib import create_topic, rdk_consumer

SESSION_MS = 6000


def check_resume_after_kill(broker, tmp_path, client: str) -> None:
    """The issue's commit-after-processing scenario, for one client library."""
    topic, group, partitions, per_partition = f"work-{client}", f"workers-{client}", 2, 40
    create_topic(broker, topic, partitions)
    produce_numbered(broker, topic, partitions, per_partition)
    total = partitions * per_partition

    first = Worker(broker, client, group, topic, tmp_path, name=f"{client}-first",
                   batch=7, delay_ms=15, session_timeout_ms=SESSION_MS, heartbeat_ms=500)
    try:
        # Kill mid-batch: after at least two commits and some records past the last one.
        def mid_batch(w):
            commits = w.of("COMMITTED")
            if len(commits) < 4:
                return False
            after = [e for e in w.of("PROCESSED") if e.t > commits[-1].t]
            return len(after) >= 3
        first.wait_for(mid_batch, 60, "two commits and a partly processed batch")
        first.kill9()
    finally:
        first.stop()
    printed = first.last_committed()
    done_first = first.processed()
    stored = committed(broker, group, topic, partitions)
    print(f"[{client}] first consumer processed {len(done_first)} records, printed commits {printed}, "
          f"broker holds {stored}")
    for p, o in printed.items():
        # The print comes after the commit is acknowledged; a kill between the two leaves more.
        assert stored[p] >= o, f"partition {p}: broker has {stored[p]}, the consumer saw {o} acknowledged"

    second = Worker(broker, client, group, topic, tmp_path, name=f"{client}-second",
                    batch=5, delay_ms=0, session_timeout_ms=SESSION_MS, heartbeat_ms=500)
    try:
        def caught_up(w):
            last = {}
            for p, o in w.processed():
                last[p] = max(last.get(p, -1), o)
            return all(last.get(p, -1) >= per_partition - 1 for p in range(partitions))
        second.wait_for(caught_up, 60, "the replacement to reach the end")
        done_second = second.processed()
    finally:
        second.stop()

    redelivered = 0
    for p in range(partitions):
        start = stored.get(p, -1001)
        start = 0 if start < 0 else start
        mine = [o for q, o in done_second if q == p]
        assert mine, f"replacement processed nothing on partition {p}"
        # Resumes exactly at the committed offset...
        assert mine[0] == start, f"partition {p}: replacement started at {mine[0]}, committed offset {start}"
        # ...in order, without gaps...
        assert mine == list(range(start, per_partition)), f"partition {p}: {mine[:10]}..."
        # ...and everything the first consumer processed past the commit is delivered again.
        past_commit = sorted({o for q, o in done_first if q == p and o >= start})
        assert set(past_commit) <= set(mine)
        redelivered += len(past_commit)
        # Nothing skipped: together they processed every record.
        seen = {o for q, o in done_first + done_second if q == p}
        assert seen == set(range(per_partition)), f"partition {p}: missing {set(range(per_partition)) - seen}"
    assert redelivered > 0, "the kill was meant to land mid-batch: some records must be delivered twice"
    print(f"[{client}] replacement resumed at {stored}; {redelivered} record(s) delivered twice "
          f"(at-least-once), {total} distinct records processed, none skipped")


def test_commit_after_processing_survives_sigkill(make_broker, monkeypatch, tmp_path):
    broker = start_group_broker(make_broker, monkeypatch)
    check_resume_after_kill(broker, tmp_path, "rdkafka")


def test_two_groups_read_one_topic_independently(make_broker, monkeypatch):
    broker = start_group_broker(make_broker, monkeypatch)
    topic, partitions, per_partition = "shared", 3, 25
    create_topic(broker, topic, partitions)
    produce_numbered(broker, topic, partitions, per_partition)
    expected = {f"p{p}-{s}" for p in range(partitions) for s in range(per_partition)}
    seen = {}
    consumers = {}
    for group in ("billing", "audit"):
        consumers[group] = Consumer({"bootstrap.servers": broker.addr, "broker.address.family": "v4",
                                     "group.id": group, "enable.auto.commit": False,
                                     "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS,
                                     "heartbeat.interval.ms": 500})
        consumers[group].subscribe([topic])
        seen[group] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(len(v) < len(expected) for v in seen.values()):
        for group, c in consumers.items():
            m = c.poll(0.1)
            if m is not None and not m.error():
                seen[group].append(m.value().decode())
                if len(seen[group]) % 20 == 0:
                    c.commit(asynchronous=False)
    for group, c in consumers.items():
        c.commit(asynchronous=False)
        c.close()
    for group, values in seen.items():
        assert len(values) == len(set(values)), f"{group} saw duplicates"
        assert set(values) == expected, f"{group} missed {len(expected - set(values))} records"
    # Each group's committed offsets are its own: both at the end.
    for group in seen:
        assert committed(broker, group, topic, partitions) == {p: per_partition for p in range(partitions)}
    print(f"two groups each read all {len(expected)} records")


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_dead_member_partitions_are_reassigned(make_broker, monkeypatch, tmp_path, strategy):
    """Kills one of two members and measures how long until the survivor owns every partition
    (target: within the session timeout plus one rebalance; printed, not asserted as a time)."""
    broker = start_group_broker(make_broker, monkeypatch)
    topic, group, partitions = f"reassign-{strategy}", f"pool-{strategy}", 4
    create_topic(broker, topic, partitions)
    produce_numbered(broker, topic, partitions, 5)
    opts = dict(batch=1, session_timeout_ms=SESSION_MS, heartbeat_ms=500, strategy=strategy)
    a = Worker(broker, "rdkafka", group, topic, tmp_path, name=f"a-{strategy}", **opts)
    b = None
    try:
        a.wait_for(lambda w: len(w.assigned()) == partitions, 30, "a to own every partition")
        b = Worker(broker, "rdkafka", group, topic, tmp_path, name=f"b-{strategy}", **opts)
        both = lambda _: len(a.assigned()) == 2 and len(b.assigned()) == 2  # noqa: E731
        b.wait_for(both, 60, "the partitions to be split between a and b")
        kept = b.assigned()
        revocations_before = len(b.of("REVOKED"))
        killed_at = a.kill9()
        done = b.wait_for(lambda w: len(w.assigned()) == partitions and w.of("ASSIGNED")[-1], 60,
                          "b to own every partition")
        took = done.t - killed_at
        print(f"[{strategy}] member killed; survivor owned all {partitions} partitions after {took:.2f} s "
              f"(session.timeout.ms={SESSION_MS}, heartbeat.interval.ms=500)")
        assert took >= SESSION_MS / 1000 * 0.9, f"reassigned before the session timeout: {took:.2f}s"
        if strategy == "cooperative-sticky":
            # Only the dead member's partitions moved: the survivor never gave up its own.
            later_revokes = b.of("REVOKED")[revocations_before:]
            taken = set()
            for e in later_revokes:
                taken |= {int(p) for p in e.args[0].split(",") if p != "-"}
            assert not (taken & kept), f"cooperative rebalance revoked the survivor's {taken & kept}"
        log = broker.log_text()
        assert "no heartbeat within its session timeout" in log
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_commit_metadata_round_trips_and_survives_kill9(make_broker, monkeypatch):
    broker = start_group_broker(make_broker, monkeypatch)
    topic, group = "meta", "meta-group"
    create_topic(broker, topic, 2)
    produce_numbered(broker, topic, 2, 10)
    c = rdk_consumer(broker, **{"group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, 4, "checkpoint=alpha"),
                      TopicPartition(topic, 1, 9, "ü-β")], asynchronous=False)
    got = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    c.close()
    assert [(t.offset, t.metadata) for t in got] == [(4, "checkpoint=alpha"), (9, "ü-β")]
    broker.kill9()
    broker.start()
    c = rdk_consumer(broker, **{"group.id": group})
    got = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    c.close()
    assert [(t.offset, t.metadata) for t in got] == [(4, "checkpoint=alpha"), (9, "ü-β")]


def test_committed_offsets_survive_kill9_during_compaction(make_broker, monkeypatch):
    """Commits in a loop while the broker is kill -9ed at random moments, with the offsets log
    table snapshotted every few dozen commits. After every restart the committed offsets are the
    last acknowledged ones (or a later attempt): the snapshot and the log after it lose nothing."""
    seed = int(time.time())
    rng = random.Random(seed)
    broker = start_group_broker(make_broker, monkeypatch, offsets_compact_min_records=40,
                                group_check_interval_ms=10)
    topic, group, partitions = "compact", "compactors", 4
    create_topic(broker, topic, partitions)
    produce_numbered(broker, topic, partitions, 2000)
    acked = {p: -1 for p in range(partitions)}
    attempted = dict(acked)
    next_offset = 0
    kills = 0
    for round_ in range(5):
        c = rdk_consumer(broker, **{"group.id": group, "socket.timeout.ms": 2000})
        kill_after = time.monotonic() + rng.uniform(0.3, 1.5)
        try:
            while time.monotonic() < kill_after and next_offset < 2000:
                next_offset += 1
                for p in range(partitions):
                    attempted[p] = next_offset
                try:
                    c.commit(offsets=[TopicPartition(topic, p, next_offset) for p in range(partitions)],
                             asynchronous=False)
                except Exception:  # noqa: BLE001 - only acknowledged commits count
                    continue
                for p in range(partitions):
                    acked[p] = next_offset
        finally:
            c.close()
        broker.kill9()
        kills += 1
        broker.start()
        got = committed(broker, group, topic, partitions)
        for p in range(partitions):
            assert acked[p] <= got[p] <= attempted[p], (
                f"seed {seed} round {round_}: partition {p} committed {got[p]}, last acked {acked[p]}, "
                f"last attempted {attempted[p]}")
    compactions = len(re.findall(r"table snapshot written;[^\n]* dir=\S*__consumer_offsets", broker.log_text()))
    print(f"seed {seed}: {next_offset} commit rounds, {kills} kill -9s, {compactions} compactions, "
          f"final offsets {acked}")
    assert compactions >= 1, "the offsets table was never snapshotted; the test did not exercise it"


def test_admin_client_group_apis(make_broker, monkeypatch):
    """librdkafka's AdminClient: list, describe, list/alter offsets, delete."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    broker = start_group_broker(make_broker, monkeypatch)
    topic, group = "admin-rdk", "rdk-admin"
    create_topic(broker, topic, 2)
    produce_numbered(broker, topic, 2, 10)
    c = Consumer({"bootstrap.servers": broker.addr, "broker.address.family": "v4", "group.id": group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "client.id": "admin-test"})
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(c.assignment()) < 2:
        c.poll(0.1)
    c.commit(offsets=[TopicPartition(topic, 0, 6, "m6"), TopicPartition(topic, 1, 2)], asynchronous=False)
    admin = AdminClient({"bootstrap.servers": broker.addr, "broker.address.family": "v4"})

    listed = admin.list_consumer_groups(request_timeout=10).result()
    states = {g.group_id: str(g.state) for g in listed.valid}
    assert "STABLE" in states.get(group, "").upper(), states
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    assert "STABLE" in str(described.state).upper()
    [m] = described.members
    assert m.client_id == "admin-test"
    assert sorted(tp.partition for tp in m.assignment.topic_partitions) == [0, 1]
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
    got = {tp.partition: (tp.offset, tp.metadata) for tp in offsets.topic_partitions}
    assert got[0][0] == 6 and got[1][0] == 2, got
    c.close()
    altered = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 1)])])[group].result()
    assert [tp.error for tp in altered.topic_partitions] == [None]
    assert committed(broker, group, topic, 2)[0] == 1
    admin.delete_consumer_groups([group], request_timeout=10)[group].result()
    listed = admin.list_consumer_groups(request_timeout=10).result()
    assert group not in {g.group_id for g in listed.valid}
