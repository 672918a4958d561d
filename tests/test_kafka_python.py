"""kafka-python (pure Python client) against a single kiln broker (and, for its admin calls,
a three-broker cluster).

api_version is left to auto-detection (ApiVersions); each test prints what
kafka-python inferred. Producers keep kafka-python 3.x's default, idempotence on
(InitProducerId, sequence numbers). Consumers have no group_id and use
assign() + seek().
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.codec import has_lz4, has_snappy, has_zstd
from kafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError

import kafka_raw
from client_targets import target  # noqa: F401  (the fixture)
from kiln_testlib import create_topic, read_partition

CODEC_IDS = {"gzip": kafka_raw.CODEC_GZIP, "snappy": kafka_raw.CODEC_SNAPPY,
             "lz4": kafka_raw.CODEC_LZ4, "zstd": kafka_raw.CODEC_ZSTD}

TIMEOUT_S = 20


def producer(broker, **kw) -> KafkaProducer:
    conf = dict(bootstrap_servers=broker.addr, acks="all",
                linger_ms=5, request_timeout_ms=10000, max_block_ms=10000)
    conf.update(kw)
    p = KafkaProducer(**conf)
    print(f"kafka-python producer: auto-detected api_version={p.config['api_version']}")
    return p


def consumer(broker, **kw) -> KafkaConsumer:
    conf = dict(bootstrap_servers=broker.addr, group_id=None, enable_auto_commit=False,
                auto_offset_reset="none", request_timeout_ms=10000, fetch_max_wait_ms=100)
    conf.update(kw)
    c = KafkaConsumer(**conf)
    print(f"kafka-python consumer: auto-detected api_version={c.config['api_version']}")
    return c


def read_back(c: KafkaConsumer, tp: TopicPartition, start: int, count: int):
    """assign + seek, then poll until `count` records arrived (bounded)."""
    c.assign([tp])
    c.seek(tp, start)
    out = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(out) < count and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=500).values():
            out.extend(recs)
    assert len(out) >= count, f"got {len(out)} of {count} records from {tp} within {TIMEOUT_S}s"
    return out


def send_all(p: KafkaProducer, items):
    """items: (topic, partition|None, key, value, ts|None); returns RecordMetadata per item."""
    futs = [p.send(t, key=k, value=v, partition=part, timestamp_ms=ts)
            for t, part, k, v, ts in items]
    p.flush(timeout=TIMEOUT_S)
    return [f.get(timeout=TIMEOUT_S) for f in futs]


def test_keyed_acks_all_and_read_back(broker):
    topic, parts, keys, per_key = "kp-keyed", 3, 12, 8
    create_topic(broker, topic, parts)
    p = producer(broker)
    items = [(topic, None, f"key-{k}".encode(), f"key-{k}:{s}".encode(), None)
             for s in range(per_key) for k in range(keys)]
    metas = send_all(p, items)
    p.close()

    by_key = {}
    for (_, _, k, v, _), m in zip(items, metas):
        by_key.setdefault(k, set()).add(m.partition)
    assert all(len(s) == 1 for s in by_key.values()), f"a key spread over partitions: {by_key}"
    acked = {(m.partition, m.offset): (it[2], it[3]) for it, m in zip(items, metas)}

    c = consumer(broker)
    total = 0
    for part in range(parts):
        n = sum(1 for (pp, _) in acked if pp == part)
        if n == 0:
            continue
        recs = read_back(c, TopicPartition(topic, part), 0, n)
        assert [r.offset for r in recs] == list(range(n))
        for r in recs:
            assert acked[(part, r.offset)] == (r.key, r.value), r
        seqs = {}
        for r in recs:
            s = int(r.value.split(b":")[1])
            assert s == seqs.get(r.key, -1) + 1, f"out of order: {r}"
            seqs[r.key] = s
        total += n
    c.close()
    assert total == keys * per_key


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_round_trip(broker, codec):
    # scripts/install-test-deps installs the codec libraries; a missing one is a failure.
    assert {"snappy": has_snappy, "lz4": has_lz4, "zstd": has_zstd}.get(codec, lambda: True)(), \
        f"kafka-python has no {codec} library: run scripts/install-test-deps"
    topic, n = f"kp-comp-{codec}", 150
    create_topic(broker, topic, 1)
    p = producer(broker, compression_type=codec, linger_ms=50)
    items = [(topic, 0, f"k{i % 5}".encode(), (f"value {i} " + "abc" * 50).encode(), None)
             for i in range(n)]
    metas = send_all(p, items)
    p.close()
    assert [m.offset for m in metas] == list(range(n))

    c = consumer(broker)
    recs = read_back(c, TopicPartition(topic, 0), 0, n)
    c.close()
    assert [(r.key, r.value) for r in recs] == [(k, v) for _, _, k, v, _ in items]
    # ...and librdkafka decodes what kafka-python compressed.
    assert [r.value for r in read_partition(broker, topic, 0)] == [v for *_, v, _ in items]
    # The broker serves the batches as kafka-python compressed them, CRCs intact.
    with kafka_raw.Conn(broker.addr) as c:
        err, hw, data = kafka_raw.fetch_v4(c, topic, 0, 0)
    batches = kafka_raw.parse_batches(data)
    assert err == 0 and hw == n and batches, (err, hw, batches)
    assert all(b.crc_ok for b in batches), batches
    assert {b.codec for b in batches} == {CODEC_IDS[codec]}, batches


def test_offsets_lookups(broker):
    topic, n, step = "kp-offsets", 12, 1000
    create_topic(broker, topic, 1)
    base = int(time.time() * 1000) - 3_600_000
    p = producer(broker)
    for chunk in range(0, n, 3):  # several batches
        send_all(p, [(topic, 0, None, f"t{i}".encode(), base + i * step)
                     for i in range(chunk, chunk + 3)])
    p.close()

    tp = TopicPartition(topic, 0)
    c = consumer(broker)
    try:
        assert c.beginning_offsets([tp], timeout_ms=10000) == {tp: 0}
        assert c.end_offsets([tp], timeout_ms=10000) == {tp: n}
        got = c.offsets_for_times({tp: base + 5 * step - 1}, timeout_ms=10000)[tp]
        assert got is not None and got.offset == 5 and got.timestamp == base + 5 * step, got
        got = c.offsets_for_times({tp: base + 4 * step}, timeout_ms=10000)[tp]
        assert got is not None and got.offset == 4, got
        got = c.offsets_for_times({tp: base + n * step}, timeout_ms=10000)[tp]
        assert got is None, f"lookup after the last timestamp should find nothing, got {got}"
        # Seeking to the looked-up offset reads from there.
        recs = read_back(c, tp, 5, n - 5)
        assert recs[0].offset == 5 and recs[0].value == b"t5" and recs[0].timestamp == base + 5 * step
    finally:
        c.close()


def test_admin_create_and_delete_topics(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.addr, request_timeout_ms=15000)
    print(f"kafka-python admin: broker_version={admin._manager.broker_version}")
    try:
        admin.create_topics({"kp-adm-a": {"num_partitions": 2, "replication_factor": 1},
                             "kp-adm-b": {"num_partitions": 1, "replication_factor": 1}})
        admin.wait_for_topics(["kp-adm-a", "kp-adm-b"], timeout_ms=10000)
        assert {"kp-adm-a", "kp-adm-b"} <= set(admin.list_topics())
        desc = {t["name"]: t for t in admin.describe_topics(["kp-adm-a"])}
        assert sorted(p["partition_index"] for p in desc["kp-adm-a"]["partitions"]) == [0, 1]

        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics({"kp-adm-a": {"num_partitions": 1, "replication_factor": 1}})

        admin.delete_topics(["kp-adm-a"])
        deadline = time.monotonic() + 10
        while "kp-adm-a" in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.2)
        topics = set(admin.list_topics())
        assert "kp-adm-a" not in topics and "kp-adm-b" in topics, topics

        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics(["kp-adm-missing"])
    finally:
        admin.close()


def test_admin_alter_configs_and_create_partitions(target):
    """kafka-python sends AlterConfigs to any broker (its least loaded one): on a cluster, one
    that is not the controller forwards the change there. Each broker in turn is the only
    bootstrap address, and each alteration must be seen by every broker."""
    target.create_topic("kp-cfg", 1)
    addrs = target.addr.split(",")
    for i, addr in enumerate(addrs):
        admin = KafkaAdminClient(bootstrap_servers=addr, request_timeout_ms=15000)
        try:
            value = str(3_600_000 + i)
            got = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "kp-cfg",
                                                      configs={"retention.ms": value})])
            assert got == {"topic": {"kp-cfg": "OK"}}, got
            bad = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "kp-cfg",
                                                      configs={"retention.ms": "soon"})])
            assert "InvalidConfigurationError" in bad["topic"]["kp-cfg"], bad
            for other in addrs:
                check = KafkaAdminClient(bootstrap_servers=other, request_timeout_ms=15000)
                try:
                    deadline = time.monotonic() + TIMEOUT_S
                    while True:
                        (configs,) = check.describe_configs(
                            [ConfigResource(ConfigResourceType.TOPIC, "kp-cfg")])["topic"].values()
                        seen = configs.get("retention.ms", {}).get("value")
                        if seen == value or time.monotonic() > deadline:
                            break
                        time.sleep(0.1)
                    assert seen == value, f"{other} describes retention.ms={seen!r}, {value} was set through {addr}"
                finally:
                    check.close()
        finally:
            admin.close()

    admin = KafkaAdminClient(bootstrap_servers=target.addr, request_timeout_ms=15000)
    try:
        admin.create_partitions({"kp-cfg": 3})
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            desc = {t["name"]: t for t in admin.describe_topics(["kp-cfg"])}
            if len(desc["kp-cfg"]["partitions"]) == 3:
                break
            time.sleep(0.2)
        assert sorted(p["partition_index"] for p in desc["kp-cfg"]["partitions"]) == [0, 1, 2]
    finally:
        admin.close()


def test_admin_describe_cluster(target):
    """kafka-python's describe_cluster() uses DescribeCluster: every broker, the controller and
    the cluster id, the same from whichever broker answers."""
    answers = []
    for addr in target.addr.split(","):
        admin = KafkaAdminClient(bootstrap_servers=addr, request_timeout_ms=15000)
        try:
            answers.append(admin.describe_cluster())
        finally:
            admin.close()
    print(f"kafka-python describe_cluster: {answers[0]}")
    expected = len(target.addr.split(","))
    for got in answers:
        assert got["cluster_id"] and got["cluster_id"].startswith("kiln-"), got
        brokers = sorted((b["broker_id"], f"{b['host']}:{b['port']}") for b in got["brokers"])
        assert len(brokers) == expected, got
        assert {addr for _, addr in brokers} == set(target.addr.split(",")), got
        assert got["controller_id"] in {i for i, _ in brokers}, got
    assert len({(a["cluster_id"], a["controller_id"]) for a in answers}) == 1, answers
