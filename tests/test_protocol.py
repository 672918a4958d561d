"""Well-formed requests whose behaviour clients rely on but rarely show:
Fetch long polling and Fetch errors, on raw sockets (tests/kafka_raw.py)."""

from __future__ import annotations

import threading
import time

import kafka_raw as kr
from kiln_testlib import Delivered, create_topic, flush_all, rdk_producer


def produce(broker, topic, values, partition=0):
    p = rdk_producer(broker)
    d = Delivered()
    for v in values:
        p.produce(topic, value=v, partition=partition, on_delivery=d.cb)
    flush_all(p, len(values), d)
    assert not d.failed, d.failed[:3]


def test_fetch_long_poll_waits_for_max_wait(broker):
    create_topic(broker, "lp", 1)
    with kr.Conn(broker.addr) as c:
        t0 = time.monotonic()
        err, hw, data = kr.fetch_v4(c, "lp", 0, 0, max_wait_ms=1000, min_bytes=1)
        elapsed = time.monotonic() - t0
    assert (err, hw, data) == (0, 0, b"")
    assert 0.8 <= elapsed <= 5.0, f"empty long poll (max_wait 1000 ms) answered after {elapsed:.2f}s"


def test_fetch_long_poll_wakes_on_produce(broker):
    create_topic(broker, "lp", 1)
    result = {}

    def fetch():
        with kr.Conn(broker.addr, timeout_s=15) as c:
            t0 = time.monotonic()
            result["resp"] = kr.fetch_v4(c, "lp", 0, 0, max_wait_ms=8000, min_bytes=1)
            result["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=fetch)
    t.start()
    time.sleep(0.5)
    produce(broker, "lp", [b"wake"])
    t.join(15)
    assert "resp" in result, "fetch did not return"
    err, hw, data = result["resp"]
    assert err == 0 and hw == 1, (err, hw)
    assert [b.record_count for b in kr.parse_batches(data)] == [1]
    assert result["elapsed"] < 5.0, (
        f"a long poll waiting for data returned after {result['elapsed']:.2f}s: the produce did "
        "not wake it (max_wait was 8 s)")


def test_fetch_offsets_at_and_past_the_end(broker):
    create_topic(broker, "oor", 1)
    produce(broker, "oor", [b"a", b"b", b"c"])
    with kr.Conn(broker.addr) as c:
        err, hw, data = kr.fetch_v4(c, "oor", 0, 3, max_wait_ms=100)
        assert (err, hw, data) == (0, 3, b""), "fetch at the high watermark: empty, no error"
        err, hw, _ = kr.fetch_v4(c, "oor", 0, 4, max_wait_ms=100)
        assert err == kr.OFFSET_OUT_OF_RANGE, f"fetch past the end: error {err}"
        err, hw, data = kr.fetch_v4(c, "oor", 0, 1, max_wait_ms=100)
        batches = kr.parse_batches(data)
        assert err == 0 and batches and batches[0].base_offset <= 1, batches


def test_fetch_unknown_topic_or_partition(broker):
    create_topic(broker, "one", 1)
    with kr.Conn(broker.addr) as c:
        err, _, _ = kr.fetch_v4(c, "no-such-topic", 0, 0, max_wait_ms=100)
        assert err == kr.UNKNOWN_TOPIC_OR_PARTITION, err
        err, _, _ = kr.fetch_v4(c, "one", 7, 0, max_wait_ms=100)
        assert err == kr.UNKNOWN_TOPIC_OR_PARTITION, err
        # The connection still works after per-partition errors.
        assert kr.api_versions_v0(c)[0] == 0


def test_auto_create_topics_when_enabled(make_broker):
    """`--auto-create-topics`: a produce to a new topic creates it with default_partitions (1)
    and the record reads back; the flag is off by default (test_librdkafka covers that)."""
    import subprocess

    b = make_broker(auto_create_topics=True)
    produced = subprocess.run(
        ["kcat", "-b", b.addr, "-P", "-t", "made-on-demand", "-K:"],
        input=b"k:v\n", capture_output=True, timeout=30,
    )
    assert produced.returncode == 0, produced.stderr.decode()
    consumed = subprocess.run(
        ["kcat", "-b", b.addr, "-C", "-t", "made-on-demand", "-o", "beginning", "-e", "-f", "%p %k:%s\n"],
        capture_output=True, timeout=30,
    )
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout.decode().split("\n")[0] == "0 k:v"
    listed = subprocess.run([b.bin, "topics", "list", "--bootstrap", b.addr], capture_output=True, timeout=30)
    assert "made-on-demand\t1 partition(s)" in listed.stdout.decode()
