"""Leader balance: leadership goes back to each partition's preferred replica once its broker
is back, on its own and on request (docs/operations.md, "Rolling restart"; kiln-broker
`cluster/rebalance.rs` and `cluster/elect.rs`, kiln-raft `Liveness::hand_over`).

test_leaders_return_to_preferred_replicas_without_loss_or_duplicates
  Three brokers, RF 3, the leader balance looking every second. A topic of 6 partitions,
  whose preferred replicas (the first of each partition's replicas) are two per broker; each
  leads its partition within 30 s of the creation (most at once, the rest handed to it). A
  librdkafka producer (enable.idempotence=true, otherwise its defaults
  and the suite's acks=all) writes keyed records to every partition from a thread throughout.
  Broker B, preferred for two partitions, is killed (kill -9): its partitions fail over to the
  other two. B is restarted. Asserted:
    - within 30 s of the restart every running broker names each partition's preferred
      replica as its leader, all agreeing, and `kiln_preferred_leader_imbalance` is 0 on
      every broker;
    - the leaders stay there (checked again 3 s later: no handover back and forth);
    - every record the producer sent is acknowledged, none failed, and each partition read
      back from offset 0 holds every acknowledged record exactly once, at its acknowledged
      offset, in the order the producer sent them, and nothing else.
  Printed: seconds from the restart to balance, records written, leader epochs before and
  after.

test_elect_leaders_on_demand_with_kiln_and_librdkafka
  The same cluster with the automatic balance off (`cluster.auto_leader_rebalance = false`)
  and the same producer. Broker B, preferred for two partitions, is killed and restarted; once
  it is back in sync its partitions stay with the survivors (imbalance > 0). Then, asserted:
    - librdkafka's AdminClient.elect_leaders (ElectLeaders, preferred) for one of them succeeds
      and B leads it; the other has not moved;
    - an UNCLEAN election is refused for the other with INVALID_REQUEST, and it stays;
    - `kiln cluster elect-leaders` (every partition) sent to another broker elects the other,
      prints it and "1 elected, 0 already led..., 0 failed"; every partition is then led by its
      preferred replica, imbalance 0 everywhere;
    - asked again for the topic, all 6 are "already led by their preferred replica";
    - an unknown topic and --partition with two --topic flags fail with a clear message;
    - every record written once, at its acknowledged offset, in order (as above).
  Printed: the seconds each election took.
"""

from __future__ import annotations

import time

import pytest

from kiln_cluster import cluster_fixture
from kiln_testlib import Delivered, RoundRobinWriter, kiln, read_partition, rdk_producer

TOPIC = "balance"
PARTITIONS = 6
BALANCE_TIMEOUT_S = 30.0
STEADY_S = 3.0
FLUSH_TIMEOUT_S = 60.0


@pytest.fixture
def cluster(request, tmp_path):
    yield from cluster_fixture(request, tmp_path, metrics=True,
                               cluster_settings={"leader_rebalance_interval_ms": 1000})


def make_writer(cluster) -> RoundRobinWriter:
    """An idempotent librdkafka producer writing to every partition in turn; its delivery
    reports in `.delivered`."""
    delivered = Delivered()
    w = RoundRobinWriter(rdk_producer(cluster.nodes[cluster.ids[0]],
                                      **{"bootstrap.servers": cluster.addr,
                                         "enable.idempotence": True,
                                         "message.timeout.ms": 60000}),
                         TOPIC, PARTITIONS, delivered.cb)
    w.delivered = delivered
    return w


def preferred_of(cluster) -> dict[int, int]:
    views = cluster.views([TOPIC])
    v = next(iter(views.values()))
    return {p: st.replicas[0] for p, st in v.topics[TOPIC][1].items()}


def imbalance(cluster) -> dict[int, float]:
    return {i: cluster.scrape(i)[("kiln_preferred_leader_imbalance", ())] for i in cluster.ids}


def wait_balanced(cluster, preferred: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Waits until every running broker names each partition's preferred replica as its
    leader and no broker reports an imbalance; returns {partition: (leader, epoch)}."""
    deadline = time.monotonic() + BALANCE_TIMEOUT_S
    while True:
        now = cluster.wait_leaders(TOPIC, PARTITIONS)
        leaders = {p: l for p, (l, _) in now.items()}
        if leaders == preferred and all(v == 0 for v in imbalance(cluster).values()):
            return now
        assert time.monotonic() < deadline, (
            f"leaders {leaders} not back to the preferred {preferred} within "
            f"{BALANCE_TIMEOUT_S}s; imbalance {imbalance(cluster)}\n{cluster.log_tail()}")
        time.sleep(0.2)


def assert_written_once(cluster, writer, preferred: dict[int, int]) -> int:
    """Every record the writer sent is acknowledged, none failed, and each partition holds
    exactly them, once each, at their acknowledged offsets, in the order sent; the count."""
    assert writer.error is None, writer.error
    remaining = writer.producer.flush(FLUSH_TIMEOUT_S)
    assert remaining == 0, f"{remaining} records not acknowledged after {FLUSH_TIMEOUT_S}s"
    assert not writer.delivered.failed, writer.delivered.failed[:5]
    total = sum(len(v) for v in writer.sent)
    assert writer.delivered.count == total

    acked = {(m.partition(), m.offset()): m.value() for m in writer.delivered.ok}
    for p in range(PARTITIONS):
        records = read_partition(cluster.nodes[preferred[p]], TOPIC, p)
        values = [r.value for r in records]
        assert values == writer.sent[p], (
            f"partition {p}: read {len(values)} records, sent {len(writer.sent[p])}; "
            f"first difference at {next((i for i, (a, b) in enumerate(zip(values, writer.sent[p])) if a != b), min(len(values), len(writer.sent[p])))}")
        for r in records:
            assert acked.get((p, r.offset)) == r.value, f"partition {p} offset {r.offset}"
    return total


def test_leaders_return_to_preferred_replicas_without_loss_or_duplicates(cluster):
    created = cluster.create_topic(TOPIC, PARTITIONS)
    preferred = preferred_of(cluster)
    assert sorted(preferred.values()) == sorted(cluster.ids * (PARTITIONS // len(cluster.ids))), preferred
    first = wait_balanced(cluster, preferred)

    writer = make_writer(cluster)
    writer.start()
    try:
        time.sleep(1.0)
        victim = preferred[0]
        cluster.kill9(victim)
        moved = cluster.wait_leaders(TOPIC, PARTITIONS)
        assert all(l != victim for l, _ in moved.values()), moved
        time.sleep(2.0)
        cluster.restart(victim)
        restarted = time.monotonic()
        now = wait_balanced(cluster, preferred)
        took = time.monotonic() - restarted
        time.sleep(STEADY_S)
        steady = cluster.wait_leaders(TOPIC, PARTITIONS)
        assert steady == now, f"leadership moved again: {now} -> {steady}"
    finally:
        writer.stop.set()
        writer.join(timeout=10)
    total = assert_written_once(cluster, writer, preferred)
    print(f"\nleader balance: back to the preferred replicas {took:.2f} s after broker "
          f"{victim} restarted; {total} records, each once; epochs at creation {created}, balanced {first}, "
          f"after the restart {steady}")


@pytest.fixture
def manual_cluster(request, tmp_path):
    yield from cluster_fixture(request, tmp_path, metrics=True,
                               cluster_settings={"auto_leader_rebalance": False})


def victims_back_in_sync(cluster, victim: int, timeout_s: float = BALANCE_TIMEOUT_S) -> None:
    """Waits until every running broker names `victim` in the ISR of every partition."""
    deadline = time.monotonic() + timeout_s
    while True:
        views = cluster.views([TOPIC])
        if len(views) == len(cluster.ids) and all(
                victim in st.isr for v in views.values() for st in v.topics[TOPIC][1].values()):
            return
        assert time.monotonic() < deadline, f"broker {victim} not back in sync\n{cluster.log_tail()}"
        time.sleep(0.2)


def test_elect_leaders_on_demand_with_kiln_and_librdkafka(manual_cluster):
    """With the automatic balance off, a broker's partitions stay with the survivors after it
    returns, until asked: librdkafka's AdminClient.elect_leaders (ElectLeaders, preferred)
    moves one partition, `kiln cluster elect-leaders` (every partition) the rest, while an
    idempotent producer writes throughout; nothing is lost or written twice. An unclean
    election, an unknown topic and bad flags are refused with a clear error."""
    from confluent_kafka import ElectionType, KafkaError, TopicPartition

    cluster = manual_cluster
    cluster.create_topic(TOPIC, PARTITIONS)
    preferred = preferred_of(cluster)
    wait_balanced(cluster, preferred)
    victim = preferred[0]
    mine = sorted(p for p, b in preferred.items() if b == victim)

    writer = make_writer(cluster)
    writer.start()
    try:
        time.sleep(1.0)
        cluster.kill9(victim)
        moved = cluster.wait_leaders(TOPIC, PARTITIONS)
        assert all(l != victim for l, _ in moved.values()), moved
        cluster.restart(victim)
        victims_back_in_sync(cluster, victim)
        time.sleep(STEADY_S)
        stayed = cluster.wait_leaders(TOPIC, PARTITIONS)
        assert all(stayed[p][0] != victim for p in mine), (
            f"leadership moved back with the balance off: {stayed}")
        assert imbalance(cluster)[stayed[mine[0]][0]] > 0

        # librdkafka: one partition.
        admin = cluster.admin()
        started = time.monotonic()
        # Its default timeouts (60 s); the binding takes no more than one of them as a keyword.
        result = admin.elect_leaders(ElectionType.PREFERRED,
                                     [TopicPartition(TOPIC, mine[0])]).result()
        one_s = time.monotonic() - started
        assert list(result.values()) == [None], result
        led = cluster.wait_leaders(TOPIC, PARTITIONS)
        assert led[mine[0]][0] == victim, led
        assert led[mine[1]][0] != victim, "only the partition asked for moved"

        # An unclean election is refused per partition; nothing moves.
        unclean = admin.elect_leaders(ElectionType.UNCLEAN,
                                      [TopicPartition(TOPIC, mine[1])]).result()
        (err,) = unclean.values()
        assert err.code() == KafkaError.INVALID_REQUEST and "out-of-sync" in err.str(), unclean

        # kiln: every partition.
        started = time.monotonic()
        out = kiln("cluster", "elect-leaders", "--bootstrap", cluster.nodes[cluster.ids[1]].addr,
                   timeout_s=60)
        all_s = time.monotonic() - started
        assert f"{TOPIC}/{mine[1]}: elected its preferred replica" in out.stdout, out.stdout
        assert "1 elected, 0 already led by their preferred replica, 0 failed" in out.stdout, out.stdout
        now = wait_balanced(cluster, preferred)

        # Asked again for the topic: nothing to do.
        anyone = cluster.nodes[cluster.ids[2]].addr
        again = kiln("cluster", "elect-leaders", "--topic", TOPIC, "--bootstrap", anyone, timeout_s=60)
        assert f"0 elected, {PARTITIONS} already led by their preferred replica, 0 failed" in again.stdout, again.stdout
        missing = kiln("cluster", "elect-leaders", "--topic", "absent", "--bootstrap", anyone,
                       check=False)
        assert missing.returncode != 0 and 'no topic "absent"' in missing.stderr, missing
        flags = kiln("cluster", "elect-leaders", "--partition", "1", "--topic", TOPIC, "--topic", "x",
                     "--bootstrap", anyone, check=False)
        assert flags.returncode != 0 and "exactly one --topic" in flags.stderr, flags
        time.sleep(1.0)
    finally:
        writer.stop.set()
        writer.join(timeout=10)
    total = assert_written_once(cluster, writer, preferred)
    assert cluster.wait_leaders(TOPIC, PARTITIONS) == now
    print(f"\nelect leaders: librdkafka moved one partition in {one_s:.2f} s, `kiln cluster "
          f"elect-leaders` the other in {all_s:.2f} s; {total} records, each once")
