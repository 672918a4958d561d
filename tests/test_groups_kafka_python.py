"""Consumer groups with kafka-python 3.x: commit-after-processing across a SIGKILL, two groups on
one topic, commit metadata, and the admin API (list, describe, offsets, alter, delete)."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.admin import KafkaAdminClient

from groups_helpers import Worker, committed, produce_numbered, start_group_broker
from kiln_testlib import create_topic
from test_groups_librdkafka import SESSION_MS, check_resume_after_kill


def kp_consumer(broker, group, **kw):
    conf = dict(bootstrap_servers=broker.addr, group_id=group, enable_auto_commit=False,
                auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500,
                fetch_max_wait_ms=100)
    conf.update(kw)
    return KafkaConsumer(**conf)


def test_commit_after_processing_survives_sigkill(make_broker, monkeypatch, tmp_path):
    broker = start_group_broker(make_broker, monkeypatch)
    check_resume_after_kill(broker, tmp_path, "kafka-python")


def test_two_groups_read_one_topic_independently(make_broker, monkeypatch):
    broker = start_group_broker(make_broker, monkeypatch)
    topic, partitions, per_partition = "shared-kp", 3, 20
    create_topic(broker, topic, partitions)
    produce_numbered(broker, topic, partitions, per_partition)
    expected = {f"p{p}-{s}" for p in range(partitions) for s in range(per_partition)}
    consumers = {g: kp_consumer(broker, g) for g in ("kp-one", "kp-two")}
    for c in consumers.values():
        c.subscribe([topic])
    seen = {g: [] for g in consumers}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(len(v) < len(expected) for v in seen.values()):
        for g, c in consumers.items():
            for _, records in c.poll(timeout_ms=100).items():
                seen[g].extend(r.value.decode() for r in records)
            c.commit()
    for c in consumers.values():
        c.close()
    for g, values in seen.items():
        assert len(values) == len(set(values)), f"{g} saw duplicates"
        assert set(values) == expected, f"{g} missed {len(expected - set(values))}"
        assert committed(broker, g, topic, partitions) == {p: per_partition for p in range(partitions)}


def test_metadata_and_admin_api(make_broker, monkeypatch):
    broker = start_group_broker(make_broker, monkeypatch)
    topic, group = "admin-kp", "kp-admin"
    create_topic(broker, topic, 2)
    produce_numbered(broker, topic, 2, 10)
    c = kp_consumer(broker, group)
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(timeout_ms=100)
    assert c.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
    c.commit({TopicPartition(topic, 0): OffsetAndMetadata(3, "agent=a1", -1),
              TopicPartition(topic, 1): OffsetAndMetadata(7, "", -1)})
    assert c.committed(TopicPartition(topic, 0), metadata=True).metadata == "agent=a1"

    admin = KafkaAdminClient(bootstrap_servers=broker.addr)
    try:
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert listed[group]["group_state"] == "Stable" and listed[group]["protocol_type"] == "consumer"
        described = admin.describe_groups([group])[group]
        assert described["group_state"] == "Stable"
        [member] = described["members"]
        assert member["member_assignment"]["assigned_partitions"] == [{"topic": topic, "partitions": [0, 1]}]
        offsets = admin.list_group_offsets({group: None})[group]
        assert offsets[TopicPartition(topic, 0)].offset == 3
        assert offsets[TopicPartition(topic, 0)].metadata == "agent=a1"
        assert offsets[TopicPartition(topic, 1)].offset == 7
        # Not while the group has members.
        with pytest.raises(Exception):
            errors = admin.delete_groups([group])
            if dict(errors)[group] != "OK":
                raise RuntimeError(errors)
        alter = admin.alter_group_offsets(group, {TopicPartition(topic, 0): OffsetAndMetadata(0, "", -1)})
        assert alter[TopicPartition(topic, 0)].__name__ != "NoError", "a reset with live members must be refused"
        c.close()
        # Empty now: an explicit reset may move the offset backwards.
        alter = admin.alter_group_offsets(group, {TopicPartition(topic, 0): OffsetAndMetadata(1, "", -1)})
        assert alter[TopicPartition(topic, 0)].__name__ == "NoError", alter
        assert committed(broker, group, topic, 2)[0] == 1
        assert dict(admin.delete_groups([group]))[group] == "OK"
        assert group not in {g["group_id"] for g in admin.list_groups()}
    finally:
        admin.close()


def test_member_commit_never_moves_offset_backwards(make_broker, monkeypatch):
    """A member committing a lower offset (after seeking back) keeps the higher one: invariant 4."""
    broker = start_group_broker(make_broker, monkeypatch)
    topic, group = "mono-kp", "kp-mono"
    create_topic(broker, topic, 1)
    produce_numbered(broker, topic, 1, 10)
    c = kp_consumer(broker, group)
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(timeout_ms=100)
    tp = TopicPartition(topic, 0)
    c.commit({tp: OffsetAndMetadata(8, "", -1)})
    c.commit({tp: OffsetAndMetadata(2, "", -1)})
    assert c.committed(tp) == 8
    c.close()
