"""librdkafka (through confluent-kafka) against a single kiln broker.

Consumers use manual assignment only and producers run with librdkafka's
defaults (tests/kiln_testlib.py), idempotence included where a test turns it on.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_raw
from client_targets import target  # noqa: F401  (the fixture)
from kiln_testlib import (Delivered, assert_contiguous, create_topic, flush_all, kiln,
                          rdk_consumer, rdk_producer, read_partition, watermarks)


@pytest.mark.parametrize("idempotence", [False, True], ids=["plain", "idempotent"])
def test_keyed_acks_all_same_partition_and_in_order(broker, idempotence):
    topic, partitions, keys, per_key = "keyed", 4, 20, 10
    create_topic(broker, topic, partitions)
    p = rdk_producer(broker, acks="all", **{"enable.idempotence": idempotence})
    d = Delivered()
    for seq in range(per_key):
        for k in range(keys):
            p.produce(topic, key=f"key-{k}", value=f"key-{k}:{seq}", on_delivery=d.cb)
        p.poll(0)
    flush_all(p, keys * per_key, d)
    assert not d.failed, f"delivery failures: {d.failed[:5]}"

    # Each key always lands on one partition.
    key_parts = defaultdict(set)
    acked_at = {}
    for m in d.ok:
        key_parts[m.key()].add(m.partition())
        acked_at[(m.partition(), m.offset())] = m.value()
    spread = {k: ps for k, ps in key_parts.items() if len(ps) != 1}
    assert not spread, f"keys on more than one partition: {spread}"
    assert len({next(iter(ps)) for ps in key_parts.values()}) > 1, "all keys on one partition"

    # Reading back: every partition holds exactly what was acknowledged there,
    # at the acknowledged offsets, and each key's records are in order.
    total = 0
    for part in range(partitions):
        recs = read_partition(broker, topic, part)
        assert_contiguous(recs, 0)
        for r in recs:
            assert acked_at.get((part, r.offset)) == r.value, f"unexpected record {r}"
            assert r.value.decode().split(":")[0] == r.key.decode()
        last_seq = {}
        for r in recs:
            seq = int(r.value.decode().split(":")[1])
            assert seq == last_seq.get(r.key, -1) + 1, f"out of order for {r.key}: {r}"
            last_seq[r.key] = seq
        total += len(recs)
    assert total == keys * per_key


@pytest.mark.parametrize("codec,codec_id", [("gzip", kafka_raw.CODEC_GZIP),
                                            ("snappy", kafka_raw.CODEC_SNAPPY),
                                            ("lz4", kafka_raw.CODEC_LZ4),
                                            ("zstd", kafka_raw.CODEC_ZSTD)])
def test_compressed_batches_round_trip(broker, codec, codec_id):
    topic, n = f"comp-{codec}", 200
    create_topic(broker, topic, 1)
    p = rdk_producer(broker, **{"compression.type": codec, "linger.ms": 100,
                                "batch.num.messages": 1000})
    d = Delivered()
    values = [(f"k{i % 7}".encode(), (f"record {i} " + "compressible " * 20).encode())
              for i in range(n)]
    for k, v in values:
        p.produce(topic, key=k, value=v, partition=0, on_delivery=d.cb)
    flush_all(p, n, d)
    assert not d.failed, f"{codec}: delivery failures: {d.failed[:3]}"

    recs = read_partition(broker, topic, 0)
    assert_contiguous(recs, 0)
    assert [(r.key, r.value) for r in recs] == values

    # The broker keeps batches as produced: what it serves is still compressed
    # with the producer's codec, and every served batch has a valid CRC-32C.
    with kafka_raw.Conn(broker.addr) as c:
        err, hw, data = kafka_raw.fetch_v4(c, topic, 0, 0)
    assert err == 0 and hw == n, (err, hw)
    batches = kafka_raw.parse_batches(data)
    assert batches, "raw fetch returned no batches"
    assert all(b.crc_ok for b in batches), batches
    hint = ""
    if codec == "lz4" and kafka_raw.FIND_COORDINATOR not in advertised_apis(broker):
        hint = ("\nlibrdkafka turns its LZ4 feature on only when the broker advertises "
                "FindCoordinator in ApiVersions (feature LZ4 depends on FindCoordinator v0); "
                "this broker does not, so librdkafka silently produced uncompressed batches")
    assert {b.codec for b in batches} == {codec_id}, f"served codecs {batches}{hint}"


def advertised_apis(broker) -> dict:
    with kafka_raw.Conn(broker.addr) as c:
        return kafka_raw.api_versions_v0(c)[1]


def test_fetch_from_arbitrary_offset(broker):
    topic, n, start = "seek", 50, 17
    create_topic(broker, topic, 1)
    p = rdk_producer(broker)
    d = Delivered()
    for i in range(n):
        p.produce(topic, value=f"v{i}", partition=0, on_delivery=d.cb)
        if i % 10 == 9:
            p.flush(10)  # several batches, so `start` lands inside one
    flush_all(p, n, d)
    assert not d.failed

    recs = read_partition(broker, topic, 0, start=start)
    assert recs[0].offset == start, f"first record returned has offset {recs[0].offset}"
    assert recs[0].value == f"v{start}".encode()
    assert_contiguous(recs, start)
    assert [r.value for r in recs] == [f"v{i}".encode() for i in range(start, n)]


def test_offsets_for_times(broker):
    topic, n = "times", 20
    create_topic(broker, topic, 1)
    base_ms = int(time.time() * 1000) - 3_600_000
    step_ms = 1000
    p = rdk_producer(broker)
    d = Delivered()
    for i in range(n):
        p.produce(topic, value=f"t{i}", partition=0, timestamp=base_ms + i * step_ms,
                  on_delivery=d.cb)
        if i % 4 == 3:
            p.flush(10)  # spread the records over several batches
    flush_all(p, n, d)
    assert not d.failed
    recs = read_partition(broker, topic, 0)
    assert [r.timestamp for r in recs] == [base_ms + i * step_ms for i in range(n)], \
        "CreateTime timestamps not preserved"

    c = rdk_consumer(broker)
    try:
        cases = {
            base_ms - 5000: 0,                  # before everything -> first offset
            base_ms + 7 * step_ms: 7,           # exact match
            base_ms + 10 * step_ms - 500: 10,   # between 9 and 10 -> first with ts >= target
            base_ms + 13 * step_ms + 1: 14,     # just after 13, mid-batch
        }
        for target, want in cases.items():
            got = c.offsets_for_times([TopicPartition(topic, 0, target)], timeout=10)
            assert got[0].error is None, got[0].error
            assert got[0].offset == want, f"ts {target - base_ms:+} ms: offset {got[0].offset}, want {want}"
        # After the last timestamp there is no such offset: Kafka answers -1
        # (librdkafka reports OFFSET_END, also -1).
        got = c.offsets_for_times([TopicPartition(topic, 0, base_ms + n * step_ms)], timeout=10)
        assert got[0].error is None and got[0].offset == -1, got[0]
    finally:
        c.close()


def test_get_watermark_offsets(broker):
    topic = "wm"
    create_topic(broker, topic, 2)
    assert watermarks(broker, topic, 0) == (0, 0)
    p = rdk_producer(broker)
    d = Delivered()
    for i in range(30):
        p.produce(topic, value=f"w{i}", partition=0, on_delivery=d.cb)
    for i in range(5):
        p.produce(topic, value=f"x{i}", partition=1, on_delivery=d.cb)
    flush_all(p, 35, d)
    assert not d.failed
    assert watermarks(broker, topic, 0) == (0, 30)
    assert watermarks(broker, topic, 1) == (0, 5)


def test_produce_unknown_topic_fails(broker):
    p = rdk_producer(broker, **{"message.timeout.ms": 5000,
                                "topic.metadata.propagation.max.ms": 100,
                                "topic.metadata.refresh.interval.ms": 200})
    d = Delivered()
    p.produce("no-such-topic", value=b"x", on_delivery=d.cb)
    assert p.flush(15) == 0
    assert not d.ok, "produce to a missing topic was acknowledged"
    assert len(d.failed) == 1
    err = d.failed[0][0]
    assert err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC), (
        f"expected UNKNOWN_TOPIC_OR_PART, got {err.name()}: {err.str()}")
    # ...and it was not auto-created (auto-create is off by default).
    md = AdminClient({"bootstrap.servers": broker.addr}).list_topics(timeout=10)
    assert "no-such-topic" not in md.topics


def test_admin_create_list_delete(broker):
    admin = AdminClient({"bootstrap.servers": broker.addr, "broker.address.family": "v4"})
    names = ["adm-a", "adm-b"]
    fs = admin.create_topics([NewTopic(n, num_partitions=3, replication_factor=1) for n in names],
                             operation_timeout=10, request_timeout=15)
    for n, f in fs.items():
        f.result(timeout=20)

    md = admin.list_topics(timeout=10)
    for n in names:
        assert n in md.topics, f"{n} not listed: {sorted(md.topics)}"
        t = md.topics[n]
        assert t.error is None and sorted(t.partitions) == [0, 1, 2], t
        assert all(p.leader == 0 for p in t.partitions.values()), t.partitions
    assert names[0] in kiln("topics", "list", "--bootstrap", broker.addr).stdout

    # Creating it again is TOPIC_ALREADY_EXISTS.
    with pytest.raises(KafkaException) as ei:
        admin.create_topics([NewTopic(names[0], 1, 1)], request_timeout=15)[names[0]].result(20)
    assert ei.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS, ei.value

    for n, f in admin.delete_topics([names[0]], operation_timeout=10, request_timeout=15).items():
        f.result(timeout=20)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=10).topics
        if names[0] not in topics:
            break
        time.sleep(0.2)
    assert names[0] not in topics, "deleted topic still listed"
    assert names[1] in topics, "the other topic went away too"

    # Deleting a missing topic is UNKNOWN_TOPIC_OR_PART.
    with pytest.raises(KafkaException) as ei:
        admin.delete_topics(["adm-missing"], request_timeout=15)["adm-missing"].result(20)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, ei.value


@pytest.mark.parametrize("acks", ["0", "1"])
def test_produce_acks_0_and_1(broker, acks):
    topic, n = f"acks{acks}", 100
    create_topic(broker, topic, 1)
    p = rdk_producer(broker, acks=acks)
    d = Delivered()
    for i in range(n):
        p.produce(topic, key=b"k", value=f"a{i}", partition=0, on_delivery=d.cb)
    flush_all(p, n, d)
    assert not d.failed, d.failed[:3]
    if acks == "1":
        assert [m.offset() for m in d.ok] == list(range(n))
    # acks=0 gets no offsets back; the records must still all arrive, in order.
    deadline = time.monotonic() + 10
    while watermarks(broker, topic, 0)[1] < n and time.monotonic() < deadline:
        time.sleep(0.1)
    recs = read_partition(broker, topic, 0)
    assert_contiguous(recs, 0)
    assert [r.value for r in recs] == [f"a{i}".encode() for i in range(n)]


def test_headers_nulls_and_large_values(broker):
    topic = "shapes"
    create_topic(broker, topic, 1)
    big = bytes(range(256)) * 2048  # 512 KiB, incompressible-ish pattern
    cases = [
        dict(key=None, value=b"no key"),
        dict(key=b"tombstone", value=None),
        dict(key=b"", value=b""),
        dict(key=b"h", value=b"with headers", headers=[("a", b"1"), ("b", None), ("a", b"2")]),
        dict(key=b"big", value=big),
    ]
    p = rdk_producer(broker, **{"message.max.bytes": 2 * 1024 * 1024})
    d = Delivered()
    for c in cases:
        p.produce(topic, partition=0, on_delivery=d.cb, **c)
        p.flush(10)
    flush_all(p, len(cases), d)
    assert not d.failed, d.failed

    cons = rdk_consumer(broker, **{"fetch.max.bytes": 4 * 1024 * 1024})
    try:
        cons.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 15
        while len(got) < len(cases) and time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is not None and not m.error():
                got.append(m)
        assert len(got) == len(cases), f"read {len(got)} of {len(cases)}"
    finally:
        cons.close()
    for c, m in zip(cases, got):
        assert m.key() == c["key"], (m.offset(), m.key())
        assert m.value() == c["value"], (m.offset(), len(m.value() or b""))
        want_headers = c.get("headers")
        assert (m.headers() or None) == want_headers, (m.offset(), m.headers())



def test_an_expired_idempotent_producer_carries_on_with_a_new_id(target):  # noqa: F811
    """A producer silent for longer than producer.id.expiration.ms (1 day of record time) is
    forgotten by the partition; its next batch gets UNKNOWN_PRODUCER_ID, and librdkafka (KIP-360)
    takes a new producer id and resends from sequence 0: delivered once, nothing fails. On one
    broker and on three."""
    topic = "expiry"
    target.create_topic(topic, 1)
    now_ms = int(time.time() * 1000)
    idempotent = {"enable.idempotence": True}
    quiet = rdk_producer(target, **idempotent)
    d = Delivered()
    quiet.produce(topic, value=b"quiet-0", partition=0, timestamp=now_ms, on_delivery=d.cb)
    flush_all(quiet, 1, d)

    # Another producer writes a day and a minute later (record time): more than 1,024 offsets,
    # so the partition looks for expired producers, and the quiet one has expired.
    busy = rdk_producer(target, **idempotent)
    busy_d = Delivered()
    later_ms = now_ms + 86_400_000 + 60_000
    for i in range(1_100):
        busy.produce(topic, value=b"busy-%d" % i, partition=0, timestamp=later_ms,
                     on_delivery=busy_d.cb)
    flush_all(busy, 1_100, busy_d)
    assert not busy_d.failed, busy_d.failed[:3]

    quiet.produce(topic, value=b"quiet-1", partition=0, on_delivery=d.cb)
    flush_all(quiet, 2, d)
    assert not d.failed, f"the expired producer's record failed: {d.failed[:3]}"
    recs = read_partition(target, topic, 0)
    assert_contiguous(recs, 0)
    values = [r.value for r in recs]
    assert values.count(b"quiet-0") == 1 and values.count(b"quiet-1") == 1
    assert values[-1] == b"quiet-1" and len(values) == 1_102

    # The batches say what happened: the quiet producer's second record came with another
    # producer id (or epoch) from sequence 0, not sequence 1 of the forgotten one.
    batches = target.batches(topic, 0)
    first, last = batches[0], batches[-1]
    assert (first.producer_id, first.base_sequence) != (-1, -1), first
    assert last.base_sequence == 0, last
    assert (last.producer_id, last.producer_epoch) != (first.producer_id, first.producer_epoch)
