"""aiokafka (asyncio, pure Python) against one broker and against a three-broker cluster.

Every test runs twice through client_targets' `target` fixture: `single` (one `kiln broker`)
and `cluster` (three brokers, topics of replication factor 3, the bootstrap list naming all
three). The clients get the bootstrap list and otherwise aiokafka's defaults, except where a
test is about a setting (`enable_idempotence=True`, `enable_auto_commit=False`).

- An idempotent producer (`enable_idempotence=True`: InitProducerId, then acks=all with
  sequence numbers) writes keyed records; every batch in the log carries one producer id and
  epoch and contiguous sequences (read with a hand-built Fetch from each partition's leader),
  so idempotence was really used, not dropped on the way.
- A consumer in a group with `enable_auto_commit=False` reads part of it and `commit()`s; a
  second consumer in the same group, started after the first closed, sees the committed
  offsets (`committed()`) and resumes exactly there: together they read every record once,
  with its exact key and value, in produce order per partition.
- The default producer (no idempotence, acks=1) writes and reads back at the acked offsets.
- Three brokers only: the idempotent producer keeps sending while partition 0's leader is
  killed with kill -9; every record is acknowledged and in the log once, in order per key.

aiokafka's own log (logger `aiokafka`) is captured; a WARNING or ERROR from it fails the test,
since against a healthy broker it has nothing to warn about (an error it logs and then
retries past would otherwise hide a broker gap).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from client_targets import target  # noqa: F401  (the fixture)
from kiln_testlib import read_partition

STEP_TIMEOUT_S = 30     # one client call or loop
KEYS = 12
PER_KEY = 25            # records per key: KEYS * PER_KEY records in all
PARTITIONS = 3


class LogCapture(logging.Handler):
    """Keeps aiokafka's WARNING and ERROR lines."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@pytest.fixture
def aiokafka_log():
    h = LogCapture()
    log = logging.getLogger("aiokafka")
    log.addHandler(h)
    yield h
    log.removeHandler(h)
    assert not h.lines, "aiokafka logged warnings or errors:\n" + "\n".join(h.lines)


def run(coro, timeout_s: float = 90):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def produce_keyed(addr: str, topic: str, **kw) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """KEYS keys x PER_KEY records `key-K:S`, S rising per key. Half are sent one at a time
    with send_and_wait (one record per request), half queued with send() and awaited
    together (batched). Returns {(partition, offset): (key, value)} from the acks."""
    p = AIOKafkaProducer(bootstrap_servers=addr, **kw)
    await asyncio.wait_for(p.start(), STEP_TIMEOUT_S)
    acked = {}
    try:
        items = [(f"key-{k}".encode(), f"key-{k}:{s}".encode())
                 for s in range(PER_KEY) for k in range(KEYS)]
        half = len(items) // 2
        for key, value in items[:half]:
            md = await asyncio.wait_for(p.send_and_wait(topic, value, key=key), STEP_TIMEOUT_S)
            acked[(md.partition, md.offset)] = (key, value)
        futs = [await p.send(topic, value, key=key) for key, value in items[half:]]
        for (key, value), md in zip(items[half:], await asyncio.wait_for(
                asyncio.gather(*futs), STEP_TIMEOUT_S)):
            acked[(md.partition, md.offset)] = (key, value)
    finally:
        await p.stop()
    assert len(acked) == KEYS * PER_KEY, f"{len(acked)} distinct acked offsets"
    return acked


def check_acked(acked: dict) -> dict[int, list[tuple[bytes, bytes]]]:
    """Per partition, the acked records in offset order: offsets 0.. contiguous, a key on one
    partition only, each key's sequence rising. Returns {partition: [(key, value)]}."""
    by_part: dict[int, list] = {}
    key_part: dict[bytes, int] = {}
    for (part, off), (key, value) in sorted(acked.items()):
        assert key_part.setdefault(key, part) == part, f"{key!r} on partitions {key_part[key]} and {part}"
        by_part.setdefault(part, []).append((off, key, value))
    for part, recs in by_part.items():
        assert [o for o, _, _ in recs] == list(range(len(recs))), f"partition {part}: offsets {recs}"
        seq: dict[bytes, int] = {}
        for _, key, value in recs:
            s = int(value.split(b":")[1])
            assert s == seq.get(key, -1) + 1, f"partition {part}: {value!r} after {seq.get(key)}"
            seq[key] = s
    return {part: [(k, v) for _, k, v in recs] for part, recs in by_part.items()}


async def consume(addr: str, topic: str, group: str, stop_after: int | None,
                  expect: dict[int, int]) -> tuple[dict[int, list], dict[int, int | None]]:
    """A group member with enable_auto_commit=False. Returns (records read per partition,
    committed offsets it saw at start). With `stop_after`, it processes getmany() results
    (at most 40 records each) until it has exactly that many, commit()s and leaves; otherwise
    it reads
    until each partition reaches `expect[partition]` records (its end) and commits."""
    c = AIOKafkaConsumer(topic, bootstrap_servers=addr, group_id=group,
                         enable_auto_commit=False, auto_offset_reset="earliest")
    await asyncio.wait_for(c.start(), STEP_TIMEOUT_S)
    got: dict[int, list] = {}
    try:
        # Wait for the assignment (the join and sync), then ask what the group has committed.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STEP_TIMEOUT_S
        while len(c.assignment()) < len(expect):
            assert loop.time() < deadline, f"assignment {c.assignment()} after {STEP_TIMEOUT_S}s"
            await asyncio.sleep(0.05)  # the join and sync run in aiokafka's background task
        committed = {tp.partition: await asyncio.wait_for(c.committed(tp), STEP_TIMEOUT_S)
                     for tp in c.assignment()}
        n, deadline = 0, loop.time() + STEP_TIMEOUT_S
        while True:
            # max_records: the first member stops at exactly `stop_after` records.
            limit = None if stop_after is None else min(stop_after - n, 40)
            for tp, recs in (await c.getmany(timeout_ms=200, max_records=limit)).items():
                got.setdefault(tp.partition, []).extend(recs)
                n += len(recs)
            if stop_after is not None and n >= stop_after:
                break
            if stop_after is None and all(
                    (committed[p] or 0) + len(got.get(p, [])) >= want for p, want in expect.items()):
                break
            assert loop.time() < deadline, (
                f"read {n} records within {STEP_TIMEOUT_S}s: "
                f"{ {p: len(r) for p, r in got.items()} } after committed {committed}")
        await asyncio.wait_for(c.commit(), STEP_TIMEOUT_S)
    finally:
        await c.stop()
    return got, committed


def test_idempotent_producer_group_manual_commit_resume(target, aiokafka_log):
    topic, group = "aio-idem", "aio-group"
    target.create_topic(topic, PARTITIONS)
    acked = run(produce_keyed(target.addr, topic, enable_idempotence=True))
    produced = check_acked(acked)

    # The log shows idempotence: one producer id and epoch on every batch, sequences
    # contiguous from 0 within each partition.
    pids = set()
    for part in range(PARTITIONS):
        seq = 0
        for b in target.batches(topic, part):
            assert b.producer_id >= 0 and b.producer_epoch >= 0, f"{topic}/{part}: {b}"
            assert b.base_sequence == seq, f"{topic}/{part}: {b}, expected sequence {seq}"
            seq += b.record_count
            pids.add((b.producer_id, b.producer_epoch))
        assert seq == len(produced.get(part, [])), (part, seq)
    assert len(pids) == 1, f"batches from several producer ids/epochs: {pids}"

    expect = {p: len(produced.get(p, [])) for p in range(PARTITIONS)}
    total = sum(expect.values())
    first, committed0 = run(consume(target.addr, topic, group, stop_after=total // 2,
                                    expect=expect))
    assert committed0 == {p: None for p in range(PARTITIONS)}, committed0
    positions = {p: len(first.get(p, [])) for p in range(PARTITIONS)}
    assert sum(positions.values()) == total // 2, positions

    # A new member of the group (the first one has left): it must see exactly what the
    # first committed and resume there.
    second, committed1 = run(consume(target.addr, topic, group, stop_after=None, expect=expect))
    # commit() commits the position of every assigned partition, 0 included where nothing was
    # read yet (None: no commit for it at all; both mean "from the beginning").
    assert {p: committed1[p] or 0 for p in range(PARTITIONS)} == positions, (committed1, positions)
    for p in range(PARTITIONS):
        recs = first.get(p, []) + second.get(p, [])
        assert [r.offset for r in recs] == list(range(expect[p])), f"partition {p}: offsets"
        assert [(r.key, r.value) for r in recs] == produced.get(p, []), f"partition {p}: records"

    # ...and the second member's commit is the end of every partition.
    async def committed_now():
        c = AIOKafkaConsumer(bootstrap_servers=target.addr, group_id=group,
                             enable_auto_commit=False)
        await c.start()
        try:
            return {p: await c.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
        finally:
            await c.stop()
    assert {p: o or 0 for p, o in run(committed_now()).items()} == expect


def test_default_producer_round_trip(target, aiokafka_log):
    topic = "aio-default"
    target.create_topic(topic, PARTITIONS)
    acked = run(produce_keyed(target.addr, topic))  # aiokafka's defaults: acks=1, no idempotence
    produced = check_acked(acked)
    for part in range(PARTITIONS):
        assert all(b.producer_id == -1 for b in target.batches(topic, part))

    async def read_all():
        c = AIOKafkaConsumer(bootstrap_servers=target.addr, enable_auto_commit=False,
                             auto_offset_reset="earliest")
        await c.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            out: dict[int, list] = {}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + STEP_TIMEOUT_S
            while sum(map(len, out.values())) < len(acked):
                assert loop.time() < deadline, {p: len(r) for p, r in out.items()}
                for tp, recs in (await c.getmany(timeout_ms=200)).items():
                    out.setdefault(tp.partition, []).extend(recs)
            return out
        finally:
            await c.stop()

    got = run(read_all())
    for p, recs in produced.items():
        assert [(r.key, r.value) for r in got[p]] == recs, f"partition {p}"


@pytest.mark.timeout(120)
def test_idempotent_producer_across_leader_kill(request, tmp_path):
    """Three brokers only: the idempotent producer keeps sending while partition 0's leader
    is killed with kill -9 (and restarted). Every record is acknowledged, and the log holds
    each exactly once, each key's in order: retries across the failover were recognised by
    their sequence numbers. aiokafka's warnings are expected here (a broker died) and shown."""
    from kiln_cluster import cluster_fixture
    for cluster in cluster_fixture(request, tmp_path / "cluster"):
        topic = "aio-failover"
        leaders = cluster.create_topic(topic, PARTITIONS)
        victim = leaders[0][0]
        n = 600

        async def produce():
            p = AIOKafkaProducer(bootstrap_servers=cluster.addr, enable_idempotence=True)
            await asyncio.wait_for(p.start(), STEP_TIMEOUT_S)
            try:
                futs = []
                for i in range(n):
                    key = f"key-{i % KEYS}".encode()
                    futs.append(await p.send(topic, f"{key.decode()}:{i // KEYS}".encode(), key=key))
                    if i == n // 3:
                        await asyncio.gather(*futs)  # a third acknowledged before the kill
                        cluster.kill9(victim)
                    await asyncio.sleep(0.002)
                return await asyncio.wait_for(asyncio.gather(*futs), 60)
            finally:
                await p.stop()

        mds = run(produce(), timeout_s=100)
        new_leader = cluster.wait_leader(topic, 0, exclude=victim)
        cluster.start(victim)
        cluster.wait_leaders(topic, PARTITIONS)  # the restarted node knows the topic again
        print(f"partition 0: leader {victim} killed, new leader and epoch {new_leader}")
        assert len({(m.partition, m.offset) for m in mds}) == n
        for part in range(PARTITIONS):
            recs = read_partition(cluster, topic, part)
            values = [r.value for r in recs]
            assert len(values) == len(set(values)), f"partition {part}: duplicates"
            assert [r.offset for r in recs] == list(range(len(recs)))
            seq: dict[bytes, int] = {}
            for r in recs:
                s = int(r.value.split(b":")[1])
                assert s == seq.get(r.key, -1) + 1, f"partition {part}: {r.value!r} after {seq.get(r.key)}"
                seq[r.key] = s
        assert sum(len(read_partition(cluster, topic, p)) for p in range(PARTITIONS)) == n
