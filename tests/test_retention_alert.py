"""Retention alert: a slow consumer falls toward the retention edge of its topic; the broker
warns (log line and /metrics) before retention deletes its first unconsumed record, and logs an
error once it has."""

from __future__ import annotations

import re
import threading
import time

from groups_helpers import Worker, metric, start_group_broker
from kiln_testlib import create_topic, rdk_producer, watermarks

RETENTION_MS = 8000


def test_slow_consumer_is_warned_before_retention_deletes_its_data(make_broker, monkeypatch, tmp_path):
    broker = start_group_broker(make_broker, monkeypatch, retention_check_interval_ms=300,
                                group_lag_check_interval_ms=200)
    topic, group = "aging", "slow"
    create_topic(broker, topic, 1, configs={"retention.ms": RETENTION_MS, "segment.ms": 1000})

    # A steady producer, so segments keep rolling and old ones become deletable.
    stop = threading.Event()

    def produce():
        p = rdk_producer(broker, **{"linger.ms": 0})
        seq = 0
        while not stop.is_set():
            p.produce(topic, value=f"r{seq}", partition=0)
            p.poll(0)
            seq += 1
            time.sleep(0.25)
        p.flush(10)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    # Far slower than the producer: its first unconsumed record ages about 0.8 s per second.
    slow = Worker(broker, "rdkafka", group, topic, tmp_path, name="slow-consumer", batch=1, delay_ms=1500)
    try:
        slow.wait_for(lambda w: w.of("COMMITTED"), 30, "a first commit")
        warn_re = (r"WARN .*group offset near retention.* group=slow topic=aging partition=0 "
                   r"committed_offset=(\d+)")
        line = broker.wait_log(warn_re, timeout_s=60)
        low, high = watermarks(broker, topic, 0)
        committed_at_warn = int(re.search(r"committed_offset=(\d+)", line).group(1))
        fraction = metric(broker, "kiln_group_retention_fraction", group, topic, 0)
        print(f"warning: {line}")
        print(f"at the warning: log start {low}, committed {committed_at_warn}, high watermark {high}, "
              f"retention fraction {fraction}")
        assert low <= committed_at_warn, "the warning came after retention deleted the data"
        assert fraction is not None and fraction >= 0.8
        assert metric(broker, "kiln_group_lag_seconds", group, topic, 0) >= 0.8 * RETENTION_MS / 1000 - 1
        assert metric(broker, "kiln_group_lag_records", group, topic, 0) > 0
        assert metric(broker, "kiln_group_offsets_lost", group, topic, 0) == 0

        # The consumer stalls completely; retention catches up with its committed offset.
        slow.kill9()
        frozen = slow.last_committed().get(0)
        error = broker.wait_log(r"ERROR .*group offset below log start.* group=slow topic=aging partition=0 "
                                r"committed_offset=(\d+)", timeout_s=60)
        print(f"error: {error}")
        assert metric(broker, "kiln_group_offsets_lost", group, topic, 0) == 1
        assert metric(broker, "kiln_group_retention_fraction", group, topic, 0) >= 1
        lost_at = int(re.search(r"committed_offset=(\d+)", error).group(1))
        assert frozen is None or lost_at >= frozen
    finally:
        stop.set()
        producer.join(timeout=15)
        slow.stop()

    # In the log, the warning precedes the deletion that passed the committed offset.
    text = broker.log_text()
    warn_at = re.search(r"group offset near retention.* group=slow", text).start()
    deletions = [(m.start(), int(m.group(1)))
                 for m in re.finditer(r"retention moved the log start.*log_start_offset=(\d+)", text)]
    passed = [pos for pos, start in deletions if start > committed_at_warn]
    assert passed, "retention never passed the committed offset"
    assert warn_at < passed[0], "the warning was logged after the data was deleted"
    print(f"warned {len(text[warn_at:passed[0]].splitlines())} log lines before the deletion")
