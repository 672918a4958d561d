"""Replacing a dead machine: a broker joins a running cluster, a dead one is decommissioned,
and every partition is back at three replicas without losing an acknowledged record
(docs/operations.md, "Cluster: adding a broker, replacing a dead one"; kiln-broker `cluster/membership.rs` and
`cluster/moves.rs`).

test_replace_a_dead_broker_with_a_new_one
  Three brokers, RF 3. A topic of 6 partitions takes keyed records from an idempotent
  librdkafka producer (acks=all) throughout; a second topic holds about 24 MiB written
  before, to copy. Then:
    - broker 3 is killed (kill -9) and its data directory deleted for good;
    - broker 4 starts on an empty directory with `[cluster] join = true` (brokers 1-3 as
      seeds) and is listed by every running broker; holding no replica yet, it names each
      partition's preferred replica and the group coordinator;
    - a move of a bulk partition to broker 4, frozen with SIGSTOP so it cannot catch up, is
      cancelled (`kiln cluster reassign --cancel --wait`): the partition goes back to the
      replicas it had and broker 4, resumed, holds nothing of it; a cancel with no move under
      way, and a second move of a partition being moved, are refused;
    - a move to a broker that is not a member, and one naming a broker twice, are refused
      with a clear error;
    - `kiln cluster decommission 3 --wait` moves every replica broker 3 held, the metadata
      and offsets logs included, to broker 4, and removes 3; each move it prints names the
      bytes the new replica holds against its leader's;
    - every running broker then lists brokers [1, 2, 4] and replicas {1, 2, 4} for every
      partition, and no move is under way (`kiln cluster status`);
    - broker 1 is killed: brokers 2 and 4 alone, a majority of every group, lead every
      partition and the producer goes on; broker 1 is restarted;
    - every record the producer sent is acknowledged, none failed, and each partition holds
      exactly them, once each, at their acknowledged offsets, in order; the 24 MiB topic
      reads back whole from broker 4.
  Printed: the seconds the decommission took and the MiB/s copied to broker 4.
"""

from __future__ import annotations

import shutil
import time

import pytest

import kafka_raw as kr
from kiln_cluster import cluster_fixture, find_coordinator_v0
from kiln_testlib import Delivered, RoundRobinWriter, kiln, rdk_producer, read_partition

TOPIC = "moves"
PARTITIONS = 6
BULK = "bulk"
BULK_PARTITIONS = 3
BULK_RECORD_BYTES = 64 << 10
BULK_RECORDS = 384  # 24 MiB
JOIN_TIMEOUT_S = 60.0
DECOMMISSION_WAIT_S = 300
FLUSH_TIMEOUT_S = 90.0
CANCEL_WAIT_S = 60


@pytest.fixture
def cluster(request, tmp_path):
    yield from cluster_fixture(request, tmp_path)


def bulk_fill(cluster) -> None:
    p = rdk_producer(cluster.nodes[1], **{"bootstrap.servers": cluster.addr,
                                         "message.max.bytes": 1 << 20})
    failed = []
    for i in range(BULK_RECORDS):
        p.produce(BULK, value=bytes([i % 251]) * BULK_RECORD_BYTES, partition=i % BULK_PARTITIONS,
                  on_delivery=lambda err, _m: failed.append(err) if err else None)
        p.poll(0)
    assert p.flush(FLUSH_TIMEOUT_S) == 0
    assert not failed, failed[:3]


def wait_listed(cluster, brokers: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        views = cluster.views()
        lists = {i: sorted(v.brokers) for i, v in views.items()}
        if views and all(l == brokers for l in lists.values()):
            return
        assert time.monotonic() < deadline, (
            f"brokers listed {lists}, wanted {brokers} everywhere\n{cluster.log_tail()}")
        time.sleep(0.5)


def replicas_everywhere(cluster, topic: str, partitions: int) -> dict[int, set[tuple[int, ...]]]:
    """{partition: the replica sets the running brokers report}."""
    out: dict[int, set[tuple[int, ...]]] = {p: set() for p in range(partitions)}
    for v in cluster.views([topic]).values():
        for p, st in v.topics[topic][1].items():
            out[p].add(tuple(sorted(st.replicas)))
    return out


def cancel_a_move_to_a_stuck_broker(cluster, anyone: str) -> None:
    """Broker 4 frozen (SIGSTOP), a move of bulk/0 to it cannot end; cancelled, the partition
    goes back to the replicas it had, and broker 4, resumed, keeps nothing of it."""
    before = replicas_everywhere(cluster, BULK, BULK_PARTITIONS)[0]
    fast = ("--timeout-s", "2", "--bootstrap", anyone)
    none = kiln("cluster", "reassign", "--topic", BULK, "--partition", "0", "--cancel", *fast,
                check=False)
    assert none.returncode != 0 and "is not being moved" in none.stderr, none
    cluster.sigstop(4)
    try:
        kiln("cluster", "reassign", "--topic", BULK, "--partition", "0", "--replicas", "1,2,4",
             *fast)
        status = kiln("cluster", "status", *fast)
        assert "1 move(s) under way" in status.stdout, status.stdout
        both = kiln("cluster", "reassign", "--topic", BULK, "--partition", "0", "--replicas",
                    "1,2", *fast, check=False)
        assert both.returncode != 0 and "already being moved" in both.stderr, both
        out = kiln("cluster", "reassign", "--topic", BULK, "--partition", "0", "--cancel",
                   "--wait", "--wait-s", str(CANCEL_WAIT_S), *fast, timeout_s=CANCEL_WAIT_S + 30)
        assert "move cancelled" in out.stdout and "done in" in out.stdout, out.stdout
    finally:
        cluster.sigcont(4)
    assert replicas_everywhere(cluster, BULK, BULK_PARTITIONS)[0] == before
    deadline = time.monotonic() + CANCEL_WAIT_S
    held = cluster.nodes[4].data_dir / "replicas"
    # It keeps only its learner replicas of the metadata and offsets logs.
    while files := [str(f) for f in held.rglob("*")
                    if f.is_file() and not f.relative_to(held).parts[0].startswith("__")]:
        assert time.monotonic() < deadline, f"broker 4 still holds {files}\n{cluster.log_tail()}"
        time.sleep(0.5)


def test_replace_a_dead_broker_with_a_new_one(cluster, request):
    cluster.create_topic(TOPIC, PARTITIONS)
    cluster.create_topic(BULK, BULK_PARTITIONS)
    bulk_fill(cluster)

    delivered = Delivered()
    writer = RoundRobinWriter(rdk_producer(cluster.nodes[1],
                                           **{"bootstrap.servers": cluster.addr,
                                              "enable.idempotence": True,
                                              "message.timeout.ms": 120000}),
                              TOPIC, PARTITIONS, delivered.cb)
    writer.start()
    try:
        time.sleep(1.0)
        cluster.kill9(3)
        shutil.rmtree(cluster.nodes[3].data_dir)
        cluster.wait_leaders(TOPIC, PARTITIONS)

        joiner = cluster.add_joiner(4)
        request.node.kiln_brokers.append(joiner)
        cluster.start(4)
        # Broker 3 is still a member (dead) until it is decommissioned.
        wait_listed(cluster, [1, 2, 3, 4], JOIN_TIMEOUT_S)
        # Broker 4 holds no replica yet: it names each partition's preferred replica (a hint,
        # epoch -1) and the group coordinator it learnt as a learner of the offsets log.
        cluster.wait_leaders(TOPIC, PARTITIONS)
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while True:
            with kr.Conn(joiner.addr, timeout_s=2.0) as conn:
                err, coordinator = find_coordinator_v0(conn, "burnin")
            if err == 0 and coordinator in (1, 2):
                break
            assert time.monotonic() < deadline, (err, coordinator)
            time.sleep(0.2)

        anyone = cluster.nodes[2].addr
        cancel_a_move_to_a_stuck_broker(cluster, anyone)
        bad = kiln("cluster", "reassign", "--topic", TOPIC, "--partition", "0", "--replicas", "1,2,9",
                   "--bootstrap", anyone, check=False)
        assert bad.returncode != 0 and "broker 9 cannot take replicas" in bad.stderr, bad
        twice = kiln("cluster", "reassign", "--topic", TOPIC, "--partition", "0", "--replicas",
                     "1,2,2", "--bootstrap", anyone, check=False)
        assert twice.returncode != 0 and "name a broker twice" in twice.stderr, twice
        unknown = kiln("cluster", "decommission", "7", "--bootstrap", anyone, check=False)
        assert unknown.returncode != 0 and "BrokerIdNotRegistered" in unknown.stderr, unknown

        started = time.monotonic()
        out = kiln("cluster", "decommission", "3", "--wait", "--wait-s", str(DECOMMISSION_WAIT_S),
                   "--bootstrap", anyone, timeout_s=DECOMMISSION_WAIT_S + 30)
        took = time.monotonic() - started
        assert "done in" in out.stdout, out.stdout
        # Each move under way names the bytes its new replica holds (DescribeLogDirs).
        moving = [line for line in out.stdout.splitlines() if line.startswith("  moving ")]
        assert all("MiB to copy" in line or "not known yet" in line for line in moving), moving
        cluster.forget(3)
        wait_listed(cluster, [1, 2, 4], 10.0)
        for topic, n in ((TOPIC, PARTITIONS), (BULK, BULK_PARTITIONS)):
            sets = replicas_everywhere(cluster, topic, n)
            assert all(s == {(1, 2, 4)} for s in sets.values()), (topic, sets)
        status = kiln("cluster", "status", "--bootstrap", anyone)
        assert "brokers: [1, 2, 4]" in status.stdout and "0 move(s) under way" in status.stdout, status.stdout
        copied = sum(f.stat().st_size for f in (cluster.nodes[4].data_dir / "replicas").rglob("*")
                     if f.is_file())

        # Broker 4 is a voter now: with 1 down, 2 and 4 are a majority of every group.
        cluster.kill9(1)
        led = cluster.wait_leaders(TOPIC, PARTITIONS)
        assert all(l in (2, 4) for l, _ in led.values()), led
        time.sleep(2.0)
        cluster.start(1)
        cluster.wait_leaders(TOPIC, PARTITIONS)
    finally:
        writer.stop.set()
        writer.join(timeout=10)

    assert writer.error is None, writer.error
    assert writer.producer.flush(FLUSH_TIMEOUT_S) == 0
    assert not delivered.failed, delivered.failed[:5]
    total = sum(len(v) for v in writer.sent)
    assert delivered.count == total
    acked = {(m.partition(), m.offset()): m.value() for m in delivered.ok}
    for p in range(PARTITIONS):
        records = read_partition(cluster.nodes[4], TOPIC, p)
        values = [r.value for r in records]
        assert values == writer.sent[p], f"partition {p}: read {len(values)}, sent {len(writer.sent[p])}"
        for r in records:
            assert acked.get((p, r.offset)) == r.value, f"partition {p} offset {r.offset}"
    bulk = sum(len(read_partition(cluster.nodes[4], BULK, p)) for p in range(BULK_PARTITIONS))
    assert bulk == BULK_RECORDS
    print(f"\nreplace a dead broker: decommission of 3 took {took:.1f} s; {copied / 2**20:.1f} MiB "
          f"on broker 4 ({copied / 2**20 / took:.1f} MiB/s); {total} records written throughout, "
          f"each once")
