"""A consumer-group member for the groups tests, run as a subprocess so a test can SIGKILL it.

It subscribes to a topic in a group, processes records one at a time (optionally slowly) and
commits after every --batch records, after processing them (at-least-once). Auto-commit is off.
Every line it prints is `<unix time> <EVENT> ...`, flushed at once:

  READY
  ASSIGNED  <p,p,...>      partitions assigned (librdkafka: incremental for cooperative)
  REVOKED   <p,p,...>
  PROCESSED <p> <offset> <value>
  COMMITTED <p> <offset>    after the broker acknowledged the commit (offset = next to read)
  ERROR     <text>

Usage: groups_consumer.py --client rdkafka|kafka-python --bootstrap HOST:PORT --group G
       --topic T [--batch N] [--delay-ms MS] [--session-timeout-ms MS] [--heartbeat-ms MS]
       [--strategy range|cooperative-sticky] [--client-id ID]
"""

from __future__ import annotations

import argparse
import sys
import time


def emit(*parts) -> None:
    sys.stdout.write(f"{time.time():.6f} " + " ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def run_rdkafka(a) -> None:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    conf = {
        "bootstrap.servers": a.bootstrap,
        "broker.address.family": "v4",
        "group.id": a.group,
        "client.id": a.client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": a.session_timeout_ms,
        "heartbeat.interval.ms": a.heartbeat_ms,
        "partition.assignment.strategy": a.strategy,
        "fetch.wait.max.ms": 100,
    }
    c = Consumer(conf)

    def on_assign(consumer, parts):
        emit("ASSIGNED", ",".join(str(p.partition) for p in sorted(parts, key=lambda p: p.partition)) or "-")
        if a.strategy == "cooperative-sticky":
            consumer.incremental_assign(parts)
        else:
            consumer.assign(parts)

    def on_revoke(consumer, parts):
        emit("REVOKED", ",".join(str(p.partition) for p in sorted(parts, key=lambda p: p.partition)) or "-")
        if a.strategy == "cooperative-sticky":
            consumer.incremental_unassign(parts)
        else:
            consumer.unassign()

    c.subscribe([a.topic], on_assign=on_assign, on_revoke=on_revoke)
    emit("READY")
    pending = {}  # partition -> next offset to commit
    processed_since_commit = 0
    while True:
        msg = c.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() != KafkaError._PARTITION_EOF:
                emit("ERROR", str(msg.error()).replace("\n", " "))
            continue
        time.sleep(a.delay_ms / 1000.0)
        emit("PROCESSED", msg.partition(), msg.offset(), (msg.value() or b"").decode())
        pending[msg.partition()] = msg.offset() + 1
        processed_since_commit += 1
        if processed_since_commit >= a.batch:
            offsets = [TopicPartition(a.topic, p, o) for p, o in sorted(pending.items())]
            try:
                done = c.commit(offsets=offsets, asynchronous=False)
            except Exception as e:  # noqa: BLE001 - reported, the batch is processed again later
                emit("ERROR", f"commit failed: {e}")
                continue
            for tp in done or []:
                if tp.error is None:
                    emit("COMMITTED", tp.partition, tp.offset)
                else:
                    emit("ERROR", f"commit {tp.partition}: {tp.error}")
            pending.clear()
            processed_since_commit = 0


def run_kafka_python(a) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer, OffsetAndMetadata, TopicPartition
    from kafka.errors import KafkaError

    c = KafkaConsumer(
        bootstrap_servers=a.bootstrap,
        group_id=a.group,
        client_id=a.client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=a.session_timeout_ms,
        heartbeat_interval_ms=a.heartbeat_ms,
        fetch_max_wait_ms=100,
    )

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            emit("REVOKED", ",".join(str(p.partition) for p in sorted(revoked, key=lambda p: p.partition)) or "-")

        def on_partitions_assigned(self, assigned):
            emit("ASSIGNED", ",".join(str(p.partition) for p in sorted(assigned, key=lambda p: p.partition)) or "-")

    c.subscribe([a.topic], listener=Listener())
    # Know the topic's partitions before the first poll() joins the group: otherwise a
    # kafka-python 3.0.12 leader can make an empty first assignment and then stall for good in
    # the rejoin that follows (see kp_subscribe in test_groups_kafka_python.py).
    deadline = time.monotonic() + 30
    while not c.partitions_for_topic(a.topic) and time.monotonic() < deadline:
        time.sleep(0.05)
    emit("READY")
    pending = {}
    processed_since_commit = 0
    while True:
        batches = c.poll(timeout_ms=200, max_records=a.batch)
        for tp, records in sorted(batches.items(), key=lambda kv: kv[0].partition):
            for r in records:
                time.sleep(a.delay_ms / 1000.0)
                emit("PROCESSED", tp.partition, r.offset, (r.value or b"").decode())
                pending[tp.partition] = r.offset + 1
                processed_since_commit += 1
                if processed_since_commit >= a.batch:
                    offsets = {TopicPartition(a.topic, p): OffsetAndMetadata(o, "", -1) for p, o in pending.items()}
                    try:
                        c.commit(offsets)
                    except KafkaError as e:
                        emit("ERROR", f"commit failed: {e!r}")
                    else:
                        for p, o in sorted(pending.items()):
                            emit("COMMITTED", p, o)
                    pending.clear()
                    processed_since_commit = 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", choices=["rdkafka", "kafka-python"], required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--heartbeat-ms", type=int, default=500)
    ap.add_argument("--strategy", default="range")
    ap.add_argument("--client-id", default="groups-test")
    a = ap.parse_args()
    if a.client == "rdkafka":
        run_rdkafka(a)
    else:
        run_kafka_python(a)


if __name__ == "__main__":
    main()
