"""Three brokers, replication factor 3: kill -9 and SIGSTOP partition leaders under load;
no acknowledged (acks=all) record may be lost, and failover must be quick.

A librdkafka producer with idempotence on (enable.idempotence=true: acks=all, retries, up to
five requests in flight per partition, sequence numbers checked by the leaders;
request.timeout.ms short enough to give up on a paused leader) writes keyed records "key:seq"
to a topic of 3 partitions, RF 3. A seeded chaos
thread repeatedly picks the current leader of a random partition (the highest leader epoch
any running broker reports) and either

  - kill -9s it: a probe producer, connected before the kill, then writes to every partition
    the victim led until each write is acknowledged; kill -> first acknowledged write is that
    partition's failover time. Only then, after a short random pause, is the victim restarted
    on the same ports and data dir, so the figure is the survivors' failover, not a restart;
  - or SIGSTOPs it for 1-4 s and SIGCONTs it (a paused leader keeps its sockets open, so
    clients only notice by timeouts, and on waking it still believes it leads).

Before each action every partition must have a leader that every running broker agrees on.
A consumer tails every partition from offset 0 the whole time.

Until it has made KILN_CHAOS_KILLS kills and KILN_CHAOS_STOPS pauses (defaults 20 and 10).

Afterwards (every node running) each partition is read from offset 0 and checked:
  - every acknowledged record is present, at the offset its acknowledgement named
    (lost = 0), and exactly once (duplicated = 0: a retried batch is recognised by its
    producer id and sequence numbers, also by a new leader);
  - per key, records appear in the order they were produced (no retry lands after a later
    batch), and the producer never hit a fatal idempotence error;
  - offsets are contiguous from 0, and no record that was never produced appears;
  - offsets follow real time: a record handed to the client after another record of the same
    partition was acknowledged is acknowledged at a higher offset (an acknowledged record is
    committed where it is, so nothing sent later can land before it);
  - every record the tailing consumer saw is still in the final log at the same offset (no
    consumer saw data that was later truncated away), and it never fell off the log;
  - no two brokers ever named different leaders for one partition in one epoch;
  - then each partition's leader is killed once more and the partition read again from the
    new leader: it must hold the same records up to the old high watermark (the replicas
    agree), and its high watermark must not be lower.

Failover: median of all samples < 2 s (the replication spec's target), every sample
measured within PROBE_LIMIT_S. The summary also gives, per kill, when a running broker first
named a new leader in Metadata, which separates election time from the write path.

Environment: KILN_CHAOS_SEED (the seed; printed, and named in failures),
KILN_CHAOS_KILLS (kills; default 20) and KILN_CHAOS_STOPS (pauses; default 10); the test's
time grows with them.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from kiln_cluster import cluster_fixture
from kiln_testlib import RDKAFKA_LOG, rdk_consumer, read_partition, resolve_implicit_acks, watermarks

SEED = int(os.environ.get("KILN_CHAOS_SEED", "4242"))
KILLS = max(1, int(os.environ.get("KILN_CHAOS_KILLS", "20")))
STOPS = max(0, int(os.environ.get("KILN_CHAOS_STOPS", "10")))
STOP_SHARE = 0.35             # share of chaos actions that are SIGSTOP pauses, while both are due
STOP_S = (1.0, 4.0)           # pause length
RESTART_PAUSE_S = (0.0, 1.0)  # after the failover is measured, before the victim restarts
GAP_S = (0.2, 1.0)            # between chaos actions
PROBE_LIMIT_S = 20.0          # a partition still unwritable this long after a kill is a failure
FAILOVER_MEDIAN_MAX_S = 2.0   # the replication spec's target for the median
TOPIC = "chaos"
PARTITIONS = 3
KEYS = 24
RATE_PER_S = 1500
TICK_S = 0.01
QUIET_AFTER_S = 2.0           # load keeps running this long after the last chaos action
TIMEOUT_S = 200 + 8 * KILLS + 5 * STOPS


@pytest.fixture
def cluster(request, tmp_path):
    yield from cluster_fixture(request, tmp_path)


class Ledger:
    """Every record produced and every acknowledgement, from all producers (thread-safe)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.produced: Counter = Counter()              # key -> records produced so far
        self.acked: dict[tuple[str, int], tuple[int, int]] = {}  # (key, seq) -> (partition, offset)
        self.sent_at: dict[tuple[str, int], float] = {}           # (key, seq) -> handed to the client
        self.acked_at: dict[tuple[str, int], float] = {}          # (key, seq) -> acknowledgement
        self.ack_times: list[float] = []
        self.failed: Counter = Counter()    # delivery reports with an error, by error name
        self.refused: Counter = Counter()   # produce() calls refused locally, by error name

    def next_seq(self, key: str) -> int:
        with self.lock:
            seq = self.produced[key]
            self.produced[key] += 1
            self.sent_at[(key, seq)] = time.monotonic()
            return seq

    def on_delivery(self, err, msg) -> None:
        key, seq = msg.value().decode().split(":")
        with self.lock:
            if err is None:
                now = time.monotonic()
                self.acked[(key, int(seq))] = (msg.partition(), msg.offset())
                self.acked_at[(key, int(seq))] = now
                self.ack_times.append(now)
            else:
                self.failed[err.name()] += 1


@dataclass
class Failover:
    kill_no: int
    victim: int
    partition: int
    epoch_before: int
    seconds: float | None       # kill -> first acknowledged write; None: not within the limit
    epoch_after: int | None = None
    leader_after: int | None = None
    metadata_s: float | None = None  # kill -> a broker first names a new running leader


def probe_producer(cluster) -> Producer:
    return Producer({
        "bootstrap.servers": cluster.addr,
        "broker.address.family": "v4",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
        "message.timeout.ms": 5000,
        "request.timeout.ms": 3000,
        "retry.backoff.ms": 20,
        "retry.backoff.max.ms": 100,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 100,
        # Metadata every 100 ms: the client learns a new leader within 100 ms of a broker
        # reporting it, so the figure measures the cluster, not the client's refresh timer.
        "topic.metadata.refresh.interval.ms": 100,
        "topic.metadata.refresh.fast.interval.ms": 50,
        "logger": RDKAFKA_LOG,
    })


class LeaderWatch(threading.Thread):
    """After a kill: when does some running broker first name a new leader (higher epoch, not
    the victim) for each partition the victim led? Separates election and metadata time from
    the write path in the failover figure."""

    def __init__(self, cluster, victim: int, epochs: dict[int, int], t_kill: float, limit_s: float):
        super().__init__(daemon=True, name="leader-watch")
        self.cluster, self.victim, self.epochs = cluster, victim, epochs
        self.t_kill, self.limit_s = t_kill, limit_s
        self.seen_at: dict[int, float] = {}

    def run(self):
        while len(self.seen_at) < len(self.epochs) and time.monotonic() < self.t_kill + self.limit_s:
            for p, epoch in self.epochs.items():
                if p in self.seen_at:
                    continue
                found = self.cluster.leader_of(TOPIC, p)
                if found and found[0] != self.victim and found[1] > epoch:
                    self.seen_at[p] = time.monotonic() - self.t_kill
            time.sleep(0.01)


class Chaos(threading.Thread):
    def __init__(self, cluster, rng: random.Random, ledger: Ledger, kills_target: int,
                 stops_target: int):
        super().__init__(daemon=True, name="chaos")
        self.cluster = cluster
        self.rng = rng
        self.ledger = ledger
        self.kills_target = kills_target
        self.stops_target = stops_target
        self.kills = 0
        self.stops = 0
        self.failovers: list[Failover] = []
        self.trace: list[str] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.last_action_end: float | None = None
        self.t0 = time.monotonic()

    def note(self, line: str) -> None:
        self.trace.append(f"{time.monotonic() - self.t0:7.2f}s {line}")

    def run(self):
        try:
            while ((self.kills < self.kills_target or self.stops < self.stops_target)
                   and not self.stop.is_set()):
                self.cluster.wait_leaders(TOPIC, PARTITIONS)
                partition = self.rng.randrange(PARTITIONS)
                victim, _ = self.cluster.wait_leader(TOPIC, partition)
                stops_due = self.stops < self.stops_target
                kills_due = self.kills < self.kills_target
                if stops_due and (not kills_due or self.rng.random() < STOP_SHARE):
                    self.pause(victim, partition)
                else:
                    self.kill(victim, partition)
                self.last_action_end = time.monotonic()
                if self.stop.wait(self.rng.uniform(*GAP_S)):
                    return
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            self.error = e

    def pause(self, victim: int, partition: int) -> None:
        length = self.rng.uniform(*STOP_S)
        self.note(f"SIGSTOP node {victim} (leader of p{partition}) for {length:.1f}s")
        self.cluster.sigstop(victim)
        self.stops += 1
        time.sleep(length)
        self.cluster.sigcont(victim)
        self.note(f"SIGCONT node {victim}")

    def kill(self, victim: int, partition: int) -> None:
        before = {p: self.cluster.leader_of(TOPIC, p) for p in range(PARTITIONS)}
        led = [p for p, found in before.items() if found and found[0] == victim]
        if partition not in led:
            self.note(f"node {victim} no longer leads p{partition}: no kill this round")
            return
        kill_no = self.kills + 1
        key = f"probe{kill_no:03d}"
        producer = probe_producer(self.cluster)
        # Connect and learn the leaders before the kill, so the figure holds no client start-up.
        warm = self.send_until_acked(producer, key, led, time.monotonic(), 10.0)
        if set(warm) != set(led):
            raise AssertionError(f"kill {kill_no}: probe could not write to {led} before the kill")

        t_kill = time.monotonic()
        self.cluster.kill9(victim)
        watch = LeaderWatch(self.cluster, victim, {p: before[p][1] for p in led}, t_kill, PROBE_LIMIT_S)
        watch.start()
        self.kills += 1
        self.note(f"kill -9 node {victim} (kill {kill_no}; it led {sorted(led)})")
        acked_after = self.send_until_acked(producer, key, led, t_kill, PROBE_LIMIT_S)
        producer.flush(10)
        watch.join(PROBE_LIMIT_S + 5)
        for p in sorted(led):
            f = Failover(kill_no, victim, p, before[p][1], acked_after.get(p),
                         metadata_s=watch.seen_at.get(p))
            found = self.cluster.leader_of(TOPIC, p)
            if found:
                f.leader_after, f.epoch_after = found
            self.failovers.append(f)
            self.note(f"  p{p}: epoch {f.epoch_before} -> {f.epoch_after}, leader {f.leader_after}, "
                      f"first ack {'none' if f.seconds is None else f'{f.seconds:.3f}s'} after the kill, "
                      f"new leader in metadata after "
                      f"{'never' if f.metadata_s is None else f'{f.metadata_s:.3f}s'}")
        time.sleep(self.rng.uniform(*RESTART_PAUSE_S))
        self.cluster.start(victim)
        self.note(f"restarted node {victim}")

    def send_until_acked(self, producer: Producer, key: str, partitions: list[int],
                         t0: float, limit_s: float) -> dict[int, float]:
        """Writes one record at a time to each partition until one is acknowledged there;
        returns {partition: seconds from t0 to its first acknowledgement}."""
        acked_at: dict[int, float] = {}
        in_flight: set[int] = set()

        def on_delivery(err, msg):
            self.ledger.on_delivery(err, msg)
            in_flight.discard(msg.partition())
            if err is None and msg.partition() not in acked_at:
                acked_at[msg.partition()] = time.monotonic() - t0

        deadline = t0 + limit_s
        while len(acked_at) < len(partitions) and time.monotonic() < deadline:
            for p in partitions:
                if p not in acked_at and p not in in_flight:
                    seq = self.ledger.next_seq(key)
                    try:
                        producer.produce(TOPIC, key=key, value=f"{key}:{seq}", partition=p,
                                         on_delivery=on_delivery)
                        in_flight.add(p)
                    except (BufferError, KafkaException) as e:
                        self.ledger.refused[type(e).__name__ if isinstance(e, BufferError)
                                            else e.args[0].name()] += 1
            producer.poll(0.005)
        return acked_at


class Tail(threading.Thread):
    """Consumes every partition from offset 0 while leaders are killed and paused."""

    def __init__(self, cluster):
        super().__init__(daemon=True, name="tail")
        self.consumer = rdk_consumer(cluster, **{
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000,
            "socket.timeout.ms": 5000,
        })
        self.seen: dict[tuple[int, int], bytes] = {}
        self.conflicts: list[str] = []
        self.errors: Counter = Counter()
        self.stop = threading.Event()

    def run(self):
        self.consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        while not self.stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    self.errors[msg.error().name()] += 1
                continue
            k = (msg.partition(), msg.offset())
            if k in self.seen and self.seen[k] != msg.value():
                self.conflicts.append(f"{k}: {self.seen[k]!r} then {msg.value()!r}")
            self.seen[k] = msg.value()
        self.consumer.close()


def real_time_order_errors(ledger: Ledger, acked: dict[tuple[str, int], tuple[int, int | None]]) -> list[str]:
    """Records acknowledged at an offset not above that of a record of the same partition whose
    acknowledgement came before they were handed to the client. An acknowledged record is
    committed at its offset, so anything sent later can only land after it. `acked` holds the
    offsets with implicit acknowledgements resolved; one still without an offset is not in
    the log, which is asserted apart."""
    errors = []
    by_partition: dict[int, list[tuple[float, int, tuple[str, int]]]] = defaultdict(list)
    for ks, (p, offset) in acked.items():
        if offset is None:
            continue
        # At equal times the send sorts first: only strictly earlier acknowledgements count.
        by_partition[p].append((ledger.acked_at[ks], 1, ks))
        by_partition[p].append((ledger.sent_at[ks], 0, ks))
    for p, events in by_partition.items():
        events.sort(key=lambda e: (e[0], e[1]))
        highest, highest_ks = -1, None
        for _, kind, ks in events:
            offset = acked[ks][1]
            if kind == 1:
                if offset > highest:
                    highest, highest_ks = offset, ks
            elif offset <= highest:
                errors.append(f"p{p}: {ks} acknowledged at offset {offset}, but {highest_ks} was "
                              f"acknowledged at {highest} before {ks} was sent")
    return errors


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def high_watermark(cluster, p: int, deadline: float) -> int:
    """Partition p's high watermark from its leader. A leader whose term has no committed entry
    yet answers OFFSET_NOT_AVAILABLE (retriable, as Kafka does): asked again until `deadline`."""
    while True:
        try:
            return watermarks(cluster, TOPIC, p)[1]
        except KafkaException as e:
            if e.args[0].code() != KafkaError.OFFSET_NOT_AVAILABLE or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


@pytest.mark.timeout(TIMEOUT_S)
def test_leaders_killed_and_paused_lose_no_acknowledged_record(cluster):
    print(f"seed={SEED} kills={KILLS} (rerun with KILN_CHAOS_SEED={SEED} KILN_CHAOS_KILLS={KILLS})")
    tag = f"[seed {SEED}]"
    rng = random.Random(SEED)
    leaders = cluster.create_topic(TOPIC, PARTITIONS, replication_factor=3)
    print(f"{TOPIC}: (leader, epoch) per partition at creation: {leaders}")
    views = cluster.views([TOPIC])
    for i, v in views.items():
        for p, st in v.topics[TOPIC][1].items():
            assert sorted(st.replicas) == cluster.ids, (
                f"{tag} node {i} reports replicas {st.replicas} for {TOPIC}/{p}; RF 3 on nodes {cluster.ids} expected")

    ledger = Ledger()
    producer = Producer({
        "bootstrap.servers": cluster.addr,
        "broker.address.family": "v4",
        "enable.idempotence": True,   # sequence numbers: no duplicates, per-key order kept
        "acks": "all",
        "message.timeout.ms": 120000,
        "request.timeout.ms": 3000,                  # give up on a paused leader, then retry
        "linger.ms": 5,
        "retry.backoff.ms": 50,
        "retry.backoff.max.ms": 200,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "topic.metadata.refresh.interval.ms": 1000,
        "queue.buffering.max.messages": 500000,
        "partitioner": "murmur2_random",
        "logger": RDKAFKA_LOG,
    })
    chaos = Chaos(cluster, rng, ledger, KILLS, STOPS)
    tail = Tail(cluster)
    tail.start()
    chaos.start()
    load_rng = random.Random(SEED + 1)
    try:
        quiet_until = None
        while True:
            now = time.monotonic()
            if chaos.error is not None:
                break
            if not chaos.is_alive():
                quiet_until = quiet_until or now + QUIET_AFTER_S
                if now >= quiet_until:
                    break
            for _ in range(int(RATE_PER_S * TICK_S)):
                key = f"k{load_rng.randrange(KEYS):02d}"
                seq = ledger.next_seq(key)
                while True:
                    try:
                        producer.produce(TOPIC, key=key, value=f"{key}:{seq}",
                                         on_delivery=ledger.on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.05)
                    except KafkaException as e:
                        # Refused locally (e.g. a broker that has not caught up yet answered
                        # Metadata without the topic): never sent, so nothing to check.
                        ledger.refused[e.args[0].name()] += 1
                        producer.poll(0.05)
                        break
            producer.poll(0)
            time.sleep(max(0.0, TICK_S - (time.monotonic() - now)))
        chaos.stop.set()
        chaos.join(60)
        if chaos.error is not None:
            raise AssertionError(f"{tag} chaos thread failed: {chaos.error!r}\n"
                                 + "\n".join(chaos.trace[-20:])) from chaos.error
        assert not chaos.is_alive(), f"{tag} chaos thread stuck"
        cluster.heal()
        cluster.wait_leaders(TOPIC, PARTITIONS)
        remaining = producer.flush(120)
        assert remaining == 0, f"{tag} {remaining} records neither acknowledged nor failed after flush(120)"
    finally:
        chaos.stop.set()
    print("chaos trace:\n" + "\n".join(chaos.trace))

    # The tailing consumer catches up with the final log, then stops.
    cluster.assert_alive()
    hws = {p: high_watermark(cluster, p, time.monotonic() + 15) for p in range(PARTITIONS)}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
            (p, hw - 1) not in tail.seen for p, hw in hws.items() if hw > 0):
        time.sleep(0.2)
    tail.stop.set()
    tail.join(15)

    # Read everything back from the current leaders.
    log: dict[tuple[int, int], bytes] = {}
    where: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    retry_inversions: list[str] = []
    never_produced: list[str] = []
    for p in range(PARTITIONS):
        recs = read_partition(cluster, TOPIC, p, end=hws[p], timeout_s=90)
        offsets = [r.offset for r in recs]
        assert offsets == list(range(len(recs))), (
            f"{tag} partition {p}: offsets not contiguous from 0 (first gap near "
            f"{next((i for i, o in enumerate(offsets) if o != i), None)})")
        first_seen: dict[str, int] = {}
        seen_seqs: dict[str, set[int]] = defaultdict(set)
        for r in recs:
            log[(p, r.offset)] = r.value
            key, seq = r.value.decode().split(":")
            seq = int(seq)
            if r.key.decode() != key or seq >= ledger.produced[key]:
                never_produced.append(f"p{p} o{r.offset}: {r}")
            where[(key, seq)].append((p, r.offset))
            if seq in seen_seqs[key]:
                continue  # a duplicate: asserted below (there must be none)
            seen_seqs[key].add(seq)
            if key in first_seen and seq <= first_seen[key]:
                retry_inversions.append(f"p{p} o{r.offset}: {key} seq {seq} first seen after seq {first_seen[key]}")
            first_seen[key] = max(seq, first_seen.get(key, seq))

    acked, implicit = resolve_implicit_acks(ledger.acked, where)
    order_errors = real_time_order_errors(ledger, acked)
    lost = {ks: po for ks, po in acked.items() if ks not in where}
    misplaced = {ks: po for ks, po in acked.items() if ks in where and po not in where[ks]}
    duplicated = {ks: pos for ks, pos in where.items() if len(pos) > 1}
    extra_copies = sum(len(pos) - 1 for pos in duplicated.values())
    tail_truncated = {po: v for po, v in tail.seen.items() if log.get(po) != v}
    acked_after_last_action = sum(1 for t in ledger.ack_times
                                  if chaos.last_action_end and t > chaos.last_action_end)
    measured = [f for f in chaos.failovers if f.seconds is not None]
    # A partition whose epoch did not move was not led by the victim at the moment of the kill
    # (leadership moved between the look-up and the kill): its quick ack is no failover.
    samples = [f.seconds for f in measured if f.epoch_after is not None and f.epoch_after > f.epoch_before]
    not_moved = [f for f in measured if f.epoch_after is not None and f.epoch_after <= f.epoch_before]
    unmeasured = [f for f in chaos.failovers if f.seconds is None]
    median = statistics.median(samples) if samples else float("inf")
    p90 = percentile(samples, 0.9) if samples else float("inf")
    worst = max(samples) if samples else float("inf")
    conflicts = cluster.epoch_conflicts()
    seen_in_metadata = [f.metadata_s for f in chaos.failovers if f.metadata_s is not None]
    metadata_median = statistics.median(seen_in_metadata) if seen_in_metadata else float("inf")

    print(f"chaos summary: seed={SEED} acknowledged={len(acked)} duplicated={len(duplicated)} "
          f"(extra copies {extra_copies}) implicitly={implicit} lost={len(lost)} misplaced={len(misplaced)} "
          f"kills={chaos.kills} sigstops={chaos.stops} "
          f"failover median={median:.3f}s p90={p90:.3f}s max={worst:.3f}s "
          f"(new leader in metadata: median {metadata_median:.3f}s) "
          f"(samples {len(samples)}, leadership already moved {len(not_moved)}, "
          f"unmeasured {len(unmeasured)}) produced={sum(ledger.produced.values())} "
          f"failed={dict(ledger.failed)} refused={dict(ledger.refused)} in_log={len(log)} "
          f"retry_inversions={len(retry_inversions)} "
          f"acked_after_last_action={acked_after_last_action} tail_seen={len(tail.seen)} "
          f"tail_errors={dict(tail.errors)}")

    assert chaos.kills >= KILLS, f"{tag} only {chaos.kills} kills happened"
    assert chaos.stops >= STOPS, f"{tag} only {chaos.stops} pauses happened"
    assert len(acked) >= 20 * KILLS, f"{tag} only {len(acked)} records acknowledged: the test proved little"
    assert acked_after_last_action > 0, f"{tag} nothing was acknowledged after the last chaos action"
    assert not conflicts, f"{tag} two leaders named for one partition in one epoch: {conflicts}"
    assert not lost, (f"{tag} {len(lost)} acknowledged records lost, e.g. "
                      + ", ".join(f"{ks} acked at {po}" for ks, po in list(lost.items())[:10]))
    assert not misplaced, (f"{tag} {len(misplaced)} acknowledged records not at their acknowledged "
                           f"offset, e.g. " + ", ".join(f"{ks} acked at {po}, found at {where[ks]}"
                                                       for ks, po in list(misplaced.items())[:10]))
    assert not never_produced, f"{tag} records nobody produced: {never_produced[:5]}"
    assert not duplicated, (f"{tag} {len(duplicated)} records written more than once ({extra_copies} "
                            f"extra copies) by an idempotent producer, e.g. "
                            + ", ".join(f"{ks} at {pos}" for ks, pos in list(duplicated.items())[:10]))
    assert not retry_inversions, (f"{tag} {len(retry_inversions)} records out of their key's order, e.g. "
                                  f"{retry_inversions[:10]}")
    fatal = {k: v for k, v in {**ledger.failed, **ledger.refused}.items() if "FATAL" in k or "SEQUENCE" in k
             or "EPOCH" in k or "UNKNOWN_PRODUCER" in k}
    assert not fatal, f"{tag} the idempotent producer met sequence or fatal errors: {fatal}"
    assert not order_errors, (f"{tag} {len(order_errors)} records acknowledged at an offset below a record "
                              f"acknowledged before they were sent: {order_errors[:10]}")
    assert not tail.conflicts, f"{tag} the same offset served different records: {tail.conflicts[:5]}"
    assert not tail_truncated, (f"{tag} {len(tail_truncated)} records the tailing consumer saw are not "
                                f"in the final log, e.g. {list(tail_truncated.items())[:5]}")
    fell_off = {k: v for k, v in tail.errors.items() if k in ("OFFSET_OUT_OF_RANGE", "_AUTO_OFFSET_RESET")}
    assert not fell_off, f"{tag} tailing consumer fell off the log: {fell_off}"
    assert not unmeasured, (f"{tag} {len(unmeasured)} partitions took no write within {PROBE_LIMIT_S}s "
                            f"of their leader's kill: {unmeasured[:5]}")
    assert samples, f"{tag} no failover was measured"
    assert median < FAILOVER_MEDIAN_MAX_S, (
        f"{tag} median failover {median:.3f}s (p90 {p90:.3f}s, max {worst:.3f}s over {len(samples)} "
        f"samples), target under {FAILOVER_MEDIAN_MAX_S}s")

    # The replicas agree: with each partition's leader killed, the new leader serves the same log.
    for p in range(PARTITIONS):
        victim, epoch = cluster.wait_leader(TOPIC, p)
        cluster.kill9(victim)
        new_leader, new_epoch = cluster.wait_leader(TOPIC, p, exclude=victim)
        assert new_epoch > epoch, f"{tag} p{p}: new leader {new_leader} at epoch {new_epoch}, was {epoch}"
        # A new leader knows the commit index once an entry of its own term is committed:
        # its high watermark may lag for a moment, but must reach the old one.
        deadline = time.monotonic() + 15
        while (hw_new := high_watermark(cluster, p, deadline)) < hws[p] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hw_new >= hws[p], (f"{tag} p{p}: high watermark {hw_new} on new leader {new_leader}, "
                                  f"{hws[p]} before its predecessor {victim} was killed")
        again = read_partition(cluster, TOPIC, p, end=hws[p], timeout_s=90)
        differ = [r.offset for r in again if log.get((p, r.offset)) != r.value]
        assert len(again) == hws[p] and not differ, (
            f"{tag} p{p}: new leader {new_leader} serves {len(again)} records below {hws[p]}, "
            f"{len(differ)} differing from what {victim} served, e.g. offsets {differ[:10]}")
        cluster.start(victim)
        cluster.wait_leaders(TOPIC, PARTITIONS)
    print(f"replicas agree: every partition re-read from a new leader ({hws})")
    assert not cluster.epoch_conflicts(), f"{tag} two leaders named in one epoch: {cluster.epoch_conflicts()}"
