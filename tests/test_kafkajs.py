"""kafkajs (pure JavaScript, Node) against one broker and against a three-broker cluster.

pytest starts the brokers (client_targets' `target` fixture: `single`, then `cluster` with
replication factor 3 and every node in the bootstrap list) and runs the Node scripts in
tests/js (`node tests/js/SCRIPT.js BOOTSTRAP ...`); each prints one JSON line, which is
checked here. kafkajs comes from tests/js/package-lock.json (`npm ci` in
scripts/install-test-deps); a missing node or kafkajs fails the file.

Every kafkajs log entry at WARN or ERROR fails the test (tests/js/common.js collects them):
against a healthy broker kafkajs has nothing to warn about, and an error it logs and retries
past would otherwise hide a broker gap.

- admin: createTopics (true, then false for the same topic), listTopics, fetchTopicOffsets,
  describeConfigs (the topic's own override and the defaults), createPartitions
  (low 0 and high the records produced, per partition, as librdkafka sees them).
- An idempotent producer (`idempotent: true`, `maxInFlightRequests: 1`, see produce.js) and
  the default producer write keyed records, one per request and batched; each ack is at the
  offset where the record is read back, a key stays on one partition in order; with
  idempotence every batch carries one producer id and contiguous sequences (a hand-built
  Fetch from each partition's leader), without it none does.
- A group member with `autoCommit: false` processes part of the topic and `commitOffsets`s
  after each batch; a second member of the group, started after the first left, reads the
  committed offsets (admin.fetchOffsets) and resumes exactly there: together they read every
  record once.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from client_targets import target  # noqa: F401  (the fixture)
from kiln_testlib import clean_env, read_partition

JS = Path(__file__).resolve().parent / "js"
NODE_TIMEOUT_S = 75     # the scripts stop themselves after 60 s
KEYS = 12
PER_KEY = 20
PARTITIONS = 3


@pytest.fixture(scope="module", autouse=True)
def kafkajs_installed():
    assert shutil.which("node"), "node is not installed: run scripts/install-test-deps"
    assert (JS / "node_modules" / "kafkajs" / "package.json").is_file(), \
        "kafkajs is not installed in tests/js/node_modules: run scripts/install-test-deps"


def node(script: str, *args, allow: str | None = None) -> dict:
    """Runs `node tests/js/SCRIPT BOOTSTRAP ...`; returns its JSON, asserting exit 0 and no
    kafkajs warnings or errors other than those matching the regex `allow` (an error answer
    the test provoked on purpose, which kafkajs logs at ERROR whether or not it expected it)."""
    cmd = ["node", str(JS / script), *map(str, args)]
    t0 = time.monotonic()
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=NODE_TIMEOUT_S,
                            stdin=subprocess.DEVNULL, env=clean_env())
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd)} still running after {NODE_TIMEOUT_S}s\n"
                             f"stderr: {e.stderr}") from None
    print(f"{script} {' '.join(map(str, args[1:]))}: {time.monotonic() - t0:.1f} s")
    lines = cp.stdout.strip().splitlines()
    assert lines, f"{' '.join(cmd)} printed nothing (exit {cp.returncode})\nstderr: {cp.stderr}"
    out = json.loads(lines[-1])
    assert cp.returncode == 0 and "error" not in out, (
        f"{' '.join(cmd)} exited {cp.returncode}: {out.get('error')}\n{out.get('stack', '')}\n"
        f"stderr (kafkajs log):\n{cp.stderr[-6000:]}")
    problems = [p for p in out["problems"] if not (allow and re.search(allow, p))]
    assert not problems, f"kafkajs logged warnings or errors ({script}):\n" + "\n".join(problems)
    return out


def expected_items() -> list[tuple[str, str]]:
    return [(f"key-{k}", f"key-{k}:{s}") for s in range(PER_KEY) for k in range(KEYS)]


def produce_and_check(target, topic: str, mode: str) -> dict[int, list[tuple[str, str]]]:
    """Runs produce.js, reads every partition back with librdkafka and checks the acks
    against it. Returns {partition: [(key, value)] in offset order}."""
    out = node("produce.js", target.addr, topic, mode, KEYS, PER_KEY)
    logs = {p: [(r.key.decode(), r.value.decode()) for r in read_partition(target.handle, topic, p)]
            for p in range(PARTITIONS)}
    items = expected_items()
    half = len(items) // 2
    assert [(k, v) for _, _, k, v in out["acked"]] == items[:half]
    for part, off, key, value in out["acked"]:
        assert logs[part][off] == (key, value), f"ack {part}/{off} for {value}, log has {logs[part][off]}"
    # The batched send: one answer per partition; the records from its base offset on are the
    # second half's, each partition's in the order sent.
    batch = dict((p, off) for p, off in out["batch"])
    rest = [rec for p in sorted(batch) for rec in logs[p][batch[p]:]]
    assert sorted(rest) == sorted(items[half:]), "the batched records are not the ones sent"
    assert sum(map(len, logs.values())) == len(items), {p: len(r) for p, r in logs.items()}
    key_part = {}
    for p, recs in logs.items():
        seq = {}
        for key, value in recs:
            assert key_part.setdefault(key, p) == p, f"{key} on partitions {key_part[key]} and {p}"
            s = int(value.split(":")[1])
            assert s == seq.get(key, -1) + 1, f"partition {p}: {value} after {seq.get(key)}"
            seq[key] = s
    # What the producer really wrote: producer id, epoch, sequences per batch.
    pids = set()
    for p in range(PARTITIONS):
        seq = 0
        for b in target.batches(topic, p):
            if mode == "idempotent":
                assert b.producer_id >= 0 and b.producer_epoch >= 0, f"{topic}/{p}: {b}"
                assert b.base_sequence == seq, f"{topic}/{p}: {b}, expected sequence {seq}"
                pids.add((b.producer_id, b.producer_epoch))
            else:
                assert b.producer_id == -1, f"{topic}/{p}: a default producer's batch {b}"
            seq += b.record_count
    if mode == "idempotent":
        assert len(pids) == 1, f"batches from several producer ids/epochs: {pids}"
    return logs


@pytest.mark.timeout(180)
def test_admin_create_list_offsets(target):
    topic = "js-admin"
    rf = 1 if target.kind == "single" else 3
    assert node("admin.js", target.addr, "create", topic, PARTITIONS, rf)["created"] is True
    configs = {c["name"]: c for c in node("admin.js", target.addr, "configs", topic)["configs"]}
    for name in ("retention.ms", "segment.bytes", "cleanup.policy"):
        assert name in configs, f"describeConfigs lacks {name}: {sorted(configs)}"
    assert configs["retention.ms"]["isDefault"] is True, configs["retention.ms"]
    # The same again: createTopics answers false (TOPIC_ALREADY_EXISTS, the only error for
    # which it does); kafkajs' connection logs that error answer at ERROR regardless.
    assert node("admin.js", target.addr, "create", topic, PARTITIONS, rf,
                allow=r"Response CreateTopics\(key: 19.*Topic creation errors")["created"] is False
    assert topic in node("admin.js", target.addr, "list")["topics"]
    offsets = node("admin.js", target.addr, "offsets", topic)["offsets"]
    assert sorted((o["partition"], o["low"], o["high"]) for o in offsets) == \
        [(p, "0", "0") for p in range(PARTITIONS)], offsets
    logs = produce_and_check(target, topic, "default")
    offsets = node("admin.js", target.addr, "offsets", topic)["offsets"]
    assert sorted((o["partition"], o["low"], o["high"]) for o in offsets) == \
        [(p, "0", str(len(logs[p]))) for p in range(PARTITIONS)], offsets
    # createPartitions raises the count; the new partitions start empty.
    assert node("admin.js", target.addr, "grow", topic, PARTITIONS + 2)["grown"] is True
    offsets = node("admin.js", target.addr, "offsets", topic)["offsets"]
    assert sorted(o["partition"] for o in offsets) == list(range(PARTITIONS + 2)), offsets


@pytest.mark.timeout(180)
def test_idempotent_producer_group_manual_commit_resume(target):
    topic, group = "js-idem", "js-group"
    target.create_topic(topic, PARTITIONS)
    logs = produce_and_check(target, topic, "idempotent")
    end = {str(p): len(logs[p]) for p in range(PARTITIONS)}
    total = sum(end.values())

    first = node("consume.js", target.addr, topic, group, total // 2, json.dumps(end))
    assert first["committed_at_start"] == {str(p): -1 for p in range(PARTITIONS)}, first
    assert len(first["records"]) == total // 2
    upto = {p: 0 for p in range(PARTITIONS)}
    for p, off, key, value in first["records"]:
        assert off == upto[p] and logs[p][off] == (key, value), (p, off, key, value)
        upto[p] = off + 1
    assert {int(p): o for p, o in first["committed"].items()} == {p: o for p, o in upto.items() if o}

    second = node("consume.js", target.addr, topic, group, -1, json.dumps(end))
    assert second["committed_at_start"] == {str(p): upto[p] if upto[p] else -1
                                            for p in range(PARTITIONS)}, second
    for p, off, key, value in second["records"]:
        assert off == upto[p] and logs[p][off] == (key, value), (p, off, key, value)
        upto[p] = off + 1
    assert upto == {p: len(logs[p]) for p in range(PARTITIONS)}, "not everything read once"
    # The group's offsets now stand at the end of every partition.
    third = node("consume.js", target.addr, topic, group, -1, json.dumps(end))
    assert third["committed_at_start"] == {str(p): len(logs[p]) for p in range(PARTITIONS)}
    assert third["records"] == []
