"""The broker's GET /metrics: parsed with the Prometheus project's own Python parser
(prometheus_client), after producing and fetching with librdkafka (confluent-kafka), and
checked against the exact amounts that traffic should have moved."""

from __future__ import annotations

import urllib.request

from confluent_kafka import KafkaError, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from groups_helpers import start_group_broker
from kiln_testlib import create_topic, rdk_consumer, rdk_producer

TOPIC = "metered"
SINGLE = 10       # records produced one request at a time
BATCHED = 40      # records produced in as few requests as librdkafka likes
VALUE = b"v" * 100


def scrape(broker) -> tuple[dict, dict]:
    """({(sample name, sorted labels): value}, {family name: family}) from GET /metrics."""
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    samples, families = {}, {}
    # The parser raises on anything the text format does not allow.
    for fam in text_string_to_metric_families(text):
        assert fam.name not in families, f"family {fam.name} appears twice"
        families[fam.name] = fam
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples, families


def value(samples, name, **labels):
    return samples[(name, tuple(sorted((k, str(v)) for k, v in labels.items())))]


def fsync_histogram(samples):
    buckets = sorted(((float(dict(k)["le"]), v) for (n, k), v in samples.items()
                      if n == "kiln_log_fsync_duration_seconds_bucket"))
    return buckets, value(samples, "kiln_log_fsync_duration_seconds_count"), \
        value(samples, "kiln_log_fsync_duration_seconds_sum")


def test_metrics_count_produce_fetch_and_fsync(make_broker, monkeypatch):
    broker = start_group_broker(make_broker, monkeypatch)
    create_topic(broker, TOPIC, 2, configs={"max.message.bytes": 4000})

    before, families = scrape(broker)
    assert families["kiln_produce_records"].type == "counter"
    assert families["kiln_log_fsync_duration_seconds"].type == "histogram"
    assert families["kiln_under_replicated_partitions"].type == "gauge"
    # One implementation for a broker of one and a cluster: a broker of one leads every
    # partition, all in sync.
    assert "in-sync replicas" in families["kiln_under_replicated_partitions"].documentation
    for name in ("kiln_produce_requests_total", "kiln_produce_records_total", "kiln_produce_bytes_total",
                 "kiln_produce_errors_total", "kiln_fetch_requests_total", "kiln_fetch_bytes_total"):
        assert value(before, name, topic=TOPIC) == 0, name
    assert value(before, "kiln_topic_partitions", topic=TOPIC) == 2
    assert value(before, "kiln_under_replicated_partitions") == 0
    assert value(before, "kiln_leader_changes_total") == 0
    assert value(before, "kiln_leader_lease_lapses_total") == 0
    _, fsyncs_before, _ = fsync_histogram(before)

    # One request per record: each is flushed (acked after its fsync) before the next is sent.
    p = rdk_producer(broker, acks="all", **{"linger.ms": 0, "message.max.bytes": 100000})
    failed = []

    def cb(err, _msg):
        if err is not None:
            failed.append(err)

    for i in range(SINGLE):
        p.produce(TOPIC, value=VALUE, key=f"k{i}", partition=i % 2, on_delivery=cb)
        assert p.flush(10) == 0
    assert failed == []
    mid, _ = scrape(broker)
    assert value(mid, "kiln_produce_requests_total", topic=TOPIC) == SINGLE
    assert value(mid, "kiln_produce_records_total", topic=TOPIC) == SINGLE
    # acks=all: each of those requests waited for its own fsync.
    _, fsyncs_mid, _ = fsync_histogram(mid)
    assert fsyncs_mid - fsyncs_before >= SINGLE

    for i in range(BATCHED):
        p.produce(TOPIC, value=VALUE, partition=i % 2, on_delivery=cb)
    assert p.flush(10) == 0
    assert failed == []
    # Over the topic's max.message.bytes (4000): the broker refuses it.
    p.produce(TOPIC, value=b"x" * 10000, partition=0, on_delivery=cb)
    assert p.flush(10) == 0
    assert len(failed) == 1 and failed[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, failed

    after, _ = scrape(broker)
    total = SINGLE + BATCHED
    assert value(after, "kiln_produce_records_total", topic=TOPIC) == total
    requests = value(after, "kiln_produce_requests_total", topic=TOPIC)
    assert SINGLE + 2 <= requests <= total + 1, requests  # batched: 1..BATCHED requests, +1 refused
    assert value(after, "kiln_produce_errors_total", topic=TOPIC) == 1
    # The log holds the batches as produced, written once: on disk are those bytes plus, per
    # partition, its segment header (4 KiB) and the Raft log's few control batches (a leader's
    # blank entry, the membership), under 1 KiB here.
    produced_bytes = value(after, "kiln_produce_bytes_total", topic=TOPIC)
    on_disk = sum(value(after, "kiln_log_size_bytes", topic=TOPIC, partition=i) for i in range(2))
    overhead = on_disk - produced_bytes
    assert 2 * 4096 <= overhead <= 2 * (4096 + 1024), (produced_bytes, on_disk)
    assert produced_bytes > total * len(VALUE)
    hw = [value(after, "kiln_log_high_watermark", topic=TOPIC, partition=i) for i in range(2)]
    assert hw == [total / 2, total / 2]
    assert value(after, "kiln_log_start_offset", topic=TOPIC, partition=0) == 0
    # A broker of one is its own quorum: its lease never lapses.
    assert value(after, "kiln_leader_lease_lapses_total") == 0

    # Fetch everything back with librdkafka.
    c = rdk_consumer(broker, **{"group.id": "metrics-reader", "enable.auto.commit": False})
    c.assign([TopicPartition(TOPIC, i, 0) for i in range(2)])
    got = 0
    for _ in range(200):
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got += 1
        if got == total:
            break
    c.close()
    assert got == total
    fetched, _ = scrape(broker)
    fetch_requests = value(fetched, "kiln_fetch_requests_total", topic=TOPIC)
    fetch_bytes = value(fetched, "kiln_fetch_bytes_total", topic=TOPIC)
    assert fetch_requests >= 1
    # Every stored byte went out at least once; librdkafka may fetch a batch again (a fetch
    # answered after it re-sent), but never much more than once.
    assert produced_bytes <= fetch_bytes <= 2 * produced_bytes, (produced_bytes, fetch_bytes)
    # Fetching moved no produce counter.
    assert value(fetched, "kiln_produce_records_total", topic=TOPIC) == total

    # The fsync histogram is a valid cumulative histogram that ends at its count.
    buckets, count, total_s = fsync_histogram(fetched)
    assert buckets[-1][0] == float("inf") and buckets[-1][1] == count
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))
    assert buckets[0][0] == 0.0001 and buckets[-2][0] == 1.0
    assert count >= fsyncs_mid and total_s > 0
    print(f"produce requests {requests:.0f} for {total} records, {produced_bytes:.0f} bytes; "
          f"fetch requests {fetch_requests:.0f}, {fetch_bytes:.0f} bytes; fsyncs {count:.0f}, "
          f"mean {1000 * total_s / count:.3f} ms")
