"""`kiln groups list|describe|reset-offsets|delete` against a running broker with librdkafka
group members."""

from __future__ import annotations

import datetime
import time

from confluent_kafka import Consumer, TopicPartition

from groups_helpers import committed, describe_cli, parse_describe_rows, produce_numbered, start_group_broker
from kiln_testlib import create_topic, kiln

HOUR_MS = 3600 * 1000


def member(broker, group, topic, partitions, seen=None):
    """A subscribed librdkafka member, returned once it owns `partitions` partitions. Records
    polled meanwhile go to `seen` as (partition, offset)."""
    c = Consumer({"bootstrap.servers": broker.addr, "broker.address.family": "v4", "group.id": group,
                  "client.id": "cli-test-member", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(c.assignment()) < partitions:
        m = c.poll(0.1)
        if m is not None and not m.error() and seen is not None:
            seen.append((m.partition(), m.offset()))
    assert len(c.assignment()) == partitions, "the member never got its partitions"
    return c


def test_list_describe_with_lag_in_records_and_seconds(make_broker, monkeypatch):
    broker = start_group_broker(make_broker, monkeypatch)
    topic, group = "cli-lag", "cli-group"
    create_topic(broker, topic, 2)
    # Records written an hour ago (CreateTime), so the lag in seconds is about 3600.
    old = int(time.time() * 1000) - HOUR_MS
    produce_numbered(broker, topic, 2, 20, timestamp_ms=lambda p, s: old + s)
    c = member(broker, group, topic, 2)
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 20)], asynchronous=False)
        listed = kiln("groups", "list", "--bootstrap", broker.addr).stdout
        assert any(line.split()[:2] == [group, "Stable"] for line in listed.splitlines()), listed
        out = describe_cli(broker, group)
        print(out)
        assert f"group {group}  state Stable  protocol consumer/range  members 1" in out
        assert "cli-test-member" in out and f"{topic}[0,1]" in out, "member and its assignment"
        rows = parse_describe_rows(out)
        r0, r1 = rows[(topic, 0)], rows[(topic, 1)]
        assert (r0["committed"], r0["end"], r0["lag"]) == ("5", "20", "15")
        assert 3590 <= float(r0["lag_s"]) <= 3700, f"lag in seconds {r0['lag_s']}"
        assert (r1["committed"], r1["end"], r1["lag"], r1["lag_s"]) == ("20", "20", "0", "0.0")
        assert r0["owner"].startswith("cli-test-member") and r0["owner"] == r1["owner"]
    finally:
        c.close()
    out = describe_cli(broker, group)
    assert "state Empty" in out and "(no live members)" in out
    missing = kiln("groups", "describe", "no-such-group", "--bootstrap", broker.addr, check=False)
    assert missing.returncode != 0 and "does not exist" in missing.stderr


def reset(broker, group, topic, *target, check=True):
    return kiln("groups", "reset-offsets", group, "--topic", topic, *target, "--bootstrap", broker.addr,
                check=check)


def test_reset_offsets_every_mode_and_refusal_with_live_members(make_broker, monkeypatch):
    broker = start_group_broker(make_broker, monkeypatch)
    topic, group = "cli-reset", "resetters"
    create_topic(broker, topic, 2)
    base = int(time.time() * 1000) - 10 * HOUR_MS
    # Record s in each partition has timestamp base + s minutes.
    produce_numbered(broker, topic, 2, 30, timestamp_ms=lambda p, s: base + s * 60_000)
    c = member(broker, group, topic, 2)
    c.commit(offsets=[TopicPartition(topic, 0, 12), TopicPartition(topic, 1, 12)], asynchronous=False)

    refused = reset(broker, group, topic, "--to-earliest", check=False)
    assert refused.returncode != 0
    assert "live member" in refused.stderr and "cli-test-member" in refused.stderr, refused.stderr
    assert committed(broker, group, topic, 2) == {0: 12, 1: 12}, "a refused reset changed offsets"
    c.close()

    out = reset(broker, group, topic, "--to-earliest").stdout
    print(out)
    assert "BEFORE" in out and "AFTER" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(topic)]
    assert rows == [[topic, "0", "12", "0"], [topic, "1", "12", "0"]], out
    assert committed(broker, group, topic, 2) == {0: 0, 1: 0}

    reset(broker, group, topic, "--to-latest")
    assert committed(broker, group, topic, 2) == {0: 30, 1: 30}

    out = reset(broker, group, topic, "--to-offset", "7", "--partitions", "1").stdout
    assert [line.split() for line in out.splitlines() if line.startswith(topic)] == [[topic, "1", "30", "7"]]
    assert committed(broker, group, topic, 2) == {0: 30, 1: 7}

    clamped = reset(broker, group, topic, "--to-offset", "999")
    assert "outside the log" in clamped.stderr
    assert committed(broker, group, topic, 2) == {0: 30, 1: 30}

    # The first record at or after base + 5 minutes is offset 5 (ISO time in another zone).
    when = datetime.datetime.fromtimestamp((base + 5 * 60_000) / 1000, tz=datetime.timezone(datetime.timedelta(hours=2)))
    reset(broker, group, topic, "--to-datetime", when.isoformat())
    assert committed(broker, group, topic, 2) == {0: 5, 1: 5}
    # A time after every record: the end, as Kafka's tool does.
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    reset(broker, group, topic, "--to-datetime", future.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert committed(broker, group, topic, 2) == {0: 30, 1: 30}

    dry = reset(broker, group, topic, "--to-earliest", "--dry-run").stdout
    assert "dry run" in dry
    assert committed(broker, group, topic, 2) == {0: 30, 1: 30}

    bad = reset(broker, group, topic, "--to-datetime", "last tuesday", check=False)
    assert bad.returncode != 0 and "ISO 8601" in bad.stderr

    # A consumer started after a reset resumes at the reset offset.
    reset(broker, group, topic, "--to-offset", "25")
    early = []
    c = member(broker, group, topic, 2, seen=early)
    try:
        first = {}
        for p, o in early:
            first.setdefault(p, o)
        deadline = time.monotonic() + 30
        while len(first) < 2 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                first.setdefault(m.partition(), m.offset())
        assert first == {0: 25, 1: 25}
    finally:
        c.close()

    kiln("groups", "delete", group, "--bootstrap", broker.addr)
    listed = kiln("groups", "list", "--bootstrap", broker.addr).stdout
    assert group not in listed
