"""A thousand replicated partitions: a broker leading a third of them is killed while a
producer writes to all of them, and nothing acknowledged is lost on any partition.

test_a_thousand_partitions_survive_the_loss_of_a_broker
  Three brokers (the shipped Raft timing), one topic of PARTITIONS partitions at RF 3, created
  through librdkafka's AdminClient. A librdkafka producer (enable.idempotence=true, otherwise
  its defaults and the suite's acks=all) writes keyed records "partition:seq" round-robin over
  every partition from a thread throughout. Once every partition has acknowledged records, the
  broker leading the most partitions is killed (kill -9). Asserted:
    - within FAILOVER_TIMEOUT_S every partition is led by a running broker, both survivors
      agreeing, and every partition the victim led acknowledges a new record;
    - the victim, restarted on its data directory, is back in the in-sync replicas of every
      partition within REJOIN_TIMEOUT_S;
    - every record sent is acknowledged (none failed), and each partition read back from
      offset 0 holds exactly its acknowledged records, each once, at its acknowledged
      offset, in the order they were sent, and nothing else.
  Printed: time to create and lead every partition, how many partitions the victim led,
  seconds from the kill until every partition was led again and until each of the victim's
  partitions acknowledged a write (median and max), the rejoin time and the records written.
  docs/benchmarks.md has the same figures for 3,000 partitions from `kiln-bench partitions`
  with a release build.

About a minute with the debug build on two cores (docs/benchmarks.md has the figures). It found the election storm that the
pulse's window of elections in flight now prevents (docs/replication.md, "Heartbeats,
elections, the pulse"): brokers opening a thousand replicas each on the saturated machine let
their leases lapse, and unbounded elections then timed out their own vote requests.

    KILN_BIN=$PWD/target/debug/kiln .venv/bin/python -m pytest -s tests/test_partition_scale.py
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from kiln_cluster import cluster_fixture
from kiln_testlib import RoundRobinWriter, kiln, rdk_consumer, rdk_producer

TOPIC = "scale"
PARTITIONS = 1000
CREATE_TIMEOUT_S = 120.0
FAILOVER_TIMEOUT_S = 30.0
REJOIN_TIMEOUT_S = 90.0
WRITE_PAUSE_S = 0.01         # the writer's pause after each WRITE_BURST records (about 2,000 a second)
WRITE_BURST = 20
FLUSH_TIMEOUT_S = 120.0
READ_TIMEOUT_S = 120.0
# Errors after which a watermark is asked again (a leader moved or is being elected).
WATERMARK_RETRIABLE = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                       KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._TRANSPORT}

# Creating and reading back a thousand partitions takes longer than the suite's usual bound.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(request, tmp_path):
    yield from cluster_fixture(request, tmp_path)


class Writer:
    """An idempotent librdkafka producer writing to every partition in turn (kiln_testlib's
    RoundRobinWriter); records each partition's acknowledged (offset, value) pairs and when
    each was acknowledged."""

    def __init__(self, cluster):
        producer = rdk_producer(cluster.nodes[cluster.ids[0]],
                                **{"bootstrap.servers": cluster.addr,
                                   "enable.idempotence": True,
                                   "message.timeout.ms": 120000})
        self.acked: list[list[tuple[int, bytes, float]]] = [[] for _ in range(PARTITIONS)]
        self.failed: list[tuple[KafkaError, int, bytes]] = []
        self.thread = RoundRobinWriter(producer, TOPIC, PARTITIONS, self.on_delivery,
                                       burst=WRITE_BURST, pause_s=WRITE_PAUSE_S)
        self.producer, self.sent, self.stop = producer, self.thread.sent, self.thread.stop

    def on_delivery(self, err, msg):
        if err is None:
            self.acked[msg.partition()].append((msg.offset(), msg.value(), time.monotonic()))
        else:
            self.failed.append((err, msg.partition(), msg.value()))

    def all_acknowledged_once(self) -> bool:
        return all(self.acked)


def wait_until(what: str, check, timeout_s: float, cluster, pause_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not within {timeout_s}s\n{cluster.log_tail()}"
        time.sleep(pause_s)


def in_sync_everywhere(cluster) -> bool:
    """Every running broker names all three replicas in sync for every partition."""
    views = cluster.views([TOPIC])
    if len(views) != len(cluster.ids):
        return False
    for v in views.values():
        terr, parts = v.topics.get(TOPIC, (-1, {}))
        if terr != 0 or len(parts) != PARTITIONS:
            return False
        if any(len(st.isr) != len(cluster.ids) for st in parts.values()):
            return False
    return True


def high_watermarks(cluster, deadline: float) -> dict[int, int]:
    """Every partition's high watermark through the AdminClient's ListOffsets (one request per
    leader), asked again for the partitions that answered a retriable error until `deadline`."""
    admin = cluster.admin()
    out: dict[int, int] = {}
    while len(out) < PARTITIONS:
        asked = {TopicPartition(TOPIC, p): OffsetSpec.latest()
                 for p in range(PARTITIONS) if p not in out}
        errors = {}
        for tp, fut in admin.list_offsets(asked, request_timeout=30).items():
            try:
                out[tp.partition] = fut.result().offset
            except KafkaException as e:
                errors[tp.partition] = e.args[0]
        for p, err in errors.items():
            assert err.code() in WATERMARK_RETRIABLE and time.monotonic() < deadline, (
                f"high watermark of partition {p}: {err}")
        if errors:
            time.sleep(0.2)
    return out


def read_everything(cluster, ends: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    """Reads [0, end) of every partition with one assigned librdkafka consumer."""
    c = rdk_consumer(cluster)
    try:
        c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS) if ends[p] > 0])
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
        left = {p for p in range(PARTITIONS) if ends[p] > 0}
        deadline = time.monotonic() + READ_TIMEOUT_S
        while left:
            assert time.monotonic() < deadline, (
                f"{len(left)} partitions not read to their end within {READ_TIMEOUT_S}s, "
                f"for example {sorted(left)[:5]}")
            for msg in c.consume(1000, timeout=0.5):
                if msg.error():
                    raise AssertionError(f"consumer error: {msg.error()}")
                p = msg.partition()
                out[p].append((msg.offset(), msg.value()))
                if msg.offset() >= ends[p] - 1:
                    left.discard(p)
        # Nothing beyond the acknowledged records: every high watermark is its partition's end.
        # Leaders may be moving back to their preferred replicas meanwhile (the leader
        # balance): a watermark asked of a leader that just handed over is asked again.
        highs = high_watermarks(cluster, deadline)
        beyond = {p: (high, ends[p]) for p, high in highs.items() if high != ends[p]}
        assert not beyond, f"high watermark != acknowledged end (high, end): {list(beyond.items())[:5]}"
        return out
    finally:
        c.close()


def test_a_thousand_partitions_survive_the_loss_of_a_broker(cluster):
    started = time.monotonic()
    created = cluster.create_topic(TOPIC, PARTITIONS, timeout_s=CREATE_TIMEOUT_S)
    create_s = time.monotonic() - started
    assert len(created) == PARTITIONS

    writer = Writer(cluster)
    writer.thread.start()
    try:
        wait_until("an acknowledged record on every partition", writer.all_acknowledged_once,
                   FLUSH_TIMEOUT_S, cluster)
        leaders = cluster.wait_leaders(TOPIC, PARTITIONS)
        led = Counter(l for l, _ in leaders.values())
        victim, victim_led = led.most_common(1)[0]
        victims_partitions = [p for p, (l, _) in leaders.items() if l == victim]
        acked_before = [len(writer.acked[p]) for p in range(PARTITIONS)]

        killed = time.monotonic()
        cluster.kill9(victim)
        moved = cluster.wait_leaders(TOPIC, PARTITIONS, timeout_s=FAILOVER_TIMEOUT_S)
        all_led_s = time.monotonic() - killed
        assert all(l != victim for l, _ in moved.values()), moved

        def writes_after_kill():
            return all(len(writer.acked[p]) > acked_before[p] for p in victims_partitions)
        wait_until("a write acknowledged on every partition the victim led", writes_after_kill,
                   FAILOVER_TIMEOUT_S, cluster)
        first_ack = [writer.acked[p][acked_before[p]][2] - killed for p in victims_partitions]

        cluster.start(victim)
        restarted = time.monotonic()
        wait_until("the victim back in every partition's in-sync replicas",
                   lambda: in_sync_everywhere(cluster), REJOIN_TIMEOUT_S, cluster, pause_s=0.5)
        rejoin_s = time.monotonic() - restarted
        # Whatever the leader balance has not yet handed back, an on-demand election does.
        elect_started = time.monotonic()
        elect = kiln("cluster", "elect-leaders", "--topic", TOPIC, "--wait-s", "60",
                     "--bootstrap", cluster.nodes[victim].addr, timeout_s=120)
        elect_s = time.monotonic() - elect_started
        summary = elect.stdout.strip().splitlines()[-1]
        assert summary.endswith(" 0 failed"), elect.stdout[-2000:]
        led_now = cluster.wait_leaders(TOPIC, PARTITIONS)
        preferred = {p: st.replicas[0] for p, st in
                     cluster.view(victim, [TOPIC]).topics[TOPIC][1].items()}
        astray = [p for p, (l, _) in led_now.items() if l != preferred[p]]
        assert not astray, f"{len(astray)} partitions not on their preferred replica: {astray[:10]}"
        time.sleep(1.0)
    finally:
        writer.stop.set()
        writer.thread.join(timeout=10)
    assert writer.thread.error is None, f"the writer failed: {writer.thread.error!r}"
    remaining = writer.producer.flush(FLUSH_TIMEOUT_S)
    assert remaining == 0, f"{remaining} records unacknowledged after {FLUSH_TIMEOUT_S}s"
    assert not writer.failed, f"{len(writer.failed)} records failed, first {writer.failed[:3]}"
    sent = sum(len(s) for s in writer.sent)
    acked = sum(len(a) for a in writer.acked)
    assert acked == sent, f"{acked} of {sent} records acknowledged"

    ends = {p: (max(o for o, _, _ in writer.acked[p]) + 1) for p in range(PARTITIONS)}
    flushed = time.monotonic()
    log = read_everything(cluster, ends)
    read_s = time.monotonic() - flushed
    problems = []
    for p in range(PARTITIONS):
        want = sorted((o, v) for o, v, _ in writer.acked[p])
        if log[p] != want:
            problems.append(f"partition {p}: read {len(log[p])} records, acknowledged "
                            f"{len(want)}; first difference at "
                            f"{next((i for i, (a, b) in enumerate(zip(log[p], want)) if a != b), min(len(log[p]), len(want)))}")
        elif [v for _, v in want] != writer.sent[p]:
            problems.append(f"partition {p}: acknowledged out of the order sent")
    assert not problems, f"{len(problems)} partitions differ: {problems[:5]}"

    print(f"\n{PARTITIONS} partitions at RF 3: created and led in {create_s:.2f} s; broker "
          f"{victim} led {victim_led}; after its kill -9 every partition was led again in "
          f"{all_led_s:.2f} s, and its partitions acknowledged a write after "
          f"{statistics.median(first_ack):.2f} s (median), {max(first_ack):.2f} s (max); "
          f"back in every ISR {rejoin_s:.2f} s after its restart; `kiln cluster elect-leaders` "
          f"({summary}) in {elect_s:.2f} s; {acked} records written, "
          f"none lost or duplicated, read back in {read_s:.2f} s; {time.monotonic() - started:.0f} s in all")
