"""kcat (the Debian package, built on its own librdkafka) against a kiln broker.

kcat without -G uses librdkafka's simple (legacy) consumer: no group protocol.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from kiln_testlib import create_topic

TIMEOUT_S = 30


def kcat(broker, *args, stdin: str | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("kcat")
    assert exe, "kcat not installed: run scripts/install-test-deps"
    cmd = [exe, "-b", broker.addr, *args]
    try:
        cp = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S,
                            stdin=None if stdin is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{cmd} timed out after {TIMEOUT_S}s; stdout={e.stdout!r} "
                             f"stderr={e.stderr!r}") from None
    assert cp.returncode == 0, f"{cmd} exited {cp.returncode}\nstdout: {cp.stdout}\nstderr: {cp.stderr}"
    assert "Delivery failed" not in cp.stderr and "% ERROR" not in cp.stderr, cp.stderr
    return cp


def test_list_metadata(broker):
    create_topic(broker, "kc-meta", 3)
    text = kcat(broker, "-L").stdout
    assert 'topic "kc-meta" with 3 partitions' in text, text

    md = json.loads(kcat(broker, "-L", "-J", "-t", "kc-meta").stdout)
    assert [b["name"] for b in md["brokers"]] == [broker.addr], md["brokers"]
    topics = {t["topic"]: t for t in md["topics"]}
    assert "kc-meta" in topics, md
    parts = topics["kc-meta"]["partitions"]
    assert sorted(p["partition"] for p in parts) == [0, 1, 2]
    assert all(p["leader"] == 0 for p in parts), parts


def test_produce_then_consume_all(broker):
    topic = "kc-rt"
    create_topic(broker, topic, 3)
    lines = [f"key{i % 6}:value-{i}" for i in range(60)]
    kcat(broker, "-P", "-K:", "-t", topic, stdin="\n".join(lines) + "\n")

    out = kcat(broker, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
               "-f", "%k:%s\n").stdout.splitlines()
    assert sorted(out) == sorted(lines), f"consumed {len(out)} lines, produced {len(lines)}"
    # Per key (one partition per key) the order is the produce order.
    for k in {line.split(":")[0] for line in lines}:
        assert [x for x in out if x.startswith(k + ":")] == [x for x in lines if x.startswith(k + ":")]


def test_consume_from_offset_and_partition(broker):
    topic = "kc-off"
    create_topic(broker, topic, 2)
    kcat(broker, "-P", "-K:", "-t", topic, "-p", "1",
         stdin="".join(f"k:p1-{i}\n" for i in range(20)))
    kcat(broker, "-P", "-K:", "-t", topic, "-p", "0", stdin="k:p0-0\nk:p0-1\n")

    out = kcat(broker, "-C", "-t", topic, "-p", "1", "-o", "7", "-e", "-q",
               "-f", "%p %o %k:%s\n").stdout.splitlines()
    assert out == [f"1 {i} k:p1-{i}" for i in range(7, 20)], out

    # A negative offset is relative to the end (ListOffsets latest).
    out = kcat(broker, "-C", "-t", topic, "-p", "1", "-o", "-3", "-e", "-q",
               "-f", "%o:%s\n").stdout.splitlines()
    assert out == ["17:p1-17", "18:p1-18", "19:p1-19"], out

    out = kcat(broker, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
               "-f", "%o:%s\n").stdout.splitlines()
    assert out == ["0:p0-0", "1:p0-1"], out


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_produce_compressed(broker, codec):
    topic = f"kc-{codec}"
    create_topic(broker, topic, 1)
    lines = [f"k:{codec}-{i}-" + "x" * 100 for i in range(50)]
    kcat(broker, "-P", "-K:", "-t", topic, "-z", codec, stdin="\n".join(lines) + "\n")
    out = kcat(broker, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
               "-f", "%k:%s\n").stdout.splitlines()
    assert out == lines
