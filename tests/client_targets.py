"""One broker or three: the `target` fixture for client suites that run every test twice.

`target` is parametrized `single` (one `kiln broker`, conftest's `broker` fixture) and
`cluster` (three brokers forming one Raft cluster, kiln_cluster's `cluster_fixture`; topics
have replication factor 3). A client is given `target.addr` as its bootstrap list (every node
for the cluster) and nothing else, so it finds leaders and coordinators itself.

`target.batches(topic, partition)` reads a partition's record batches with a hand-built Fetch
(kafka_raw) from its leader, so a test can see what the client actually wrote: producer id,
epoch and base sequence of each batch, which client libraries do not expose.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import pytest

import kafka_raw as kr
from kiln_cluster import cluster_fixture
from kiln_testlib import create_topic

FETCH_DEADLINE_S = 15.0


@dataclass
class Target:
    kind: str                       # "single" or "cluster"
    addr: str                       # bootstrap list
    leader_addr: Callable[[str, int], str]
    _create: Callable[[str, int], None]
    handle: object                  # the Broker or the Cluster

    def create_topic(self, name: str, partitions: int) -> None:
        """Creates the topic (RF 1 on one broker, RF 3 on the cluster) and waits until every
        partition has a leader."""
        self._create(name, partitions)

    def batches(self, topic: str, partition: int) -> list[kr.Batch]:
        """Every record batch of the partition up to its high watermark, from its leader."""
        out: list[kr.Batch] = []
        offset, hw = 0, None
        deadline = time.monotonic() + FETCH_DEADLINE_S
        while hw is None or offset < hw:
            assert time.monotonic() < deadline, (
                f"{topic}/{partition}: read batches up to {offset} of high watermark {hw} "
                f"within {FETCH_DEADLINE_S}s: {out}")
            with kr.Conn(self.leader_addr(topic, partition)) as c:
                err, hw, data = kr.fetch_v4(c, topic, partition, offset)
            assert err == 0, f"Fetch {topic}/{partition} at {offset}: error {err}"
            for b in kr.parse_batches(data):
                if b.base_offset + b.last_offset_delta >= offset:
                    out.append(b)
                    offset = b.base_offset + b.last_offset_delta + 1
        return out


@pytest.fixture(params=["single", "cluster"])
def target(request, tmp_path):
    """A running single broker or a formed three-broker cluster; stopped at the end."""
    if request.param == "single":
        b = request.getfixturevalue("broker")
        yield Target("single", b.addr, lambda _t, _p: b.addr,
                     lambda name, parts: create_topic(b, name, parts), b)
        return

    def leader_addr(topic: str, partition: int) -> str:
        leader, _epoch = c.wait_leader(topic, partition)
        return c.nodes[leader].addr

    for c in cluster_fixture(request, tmp_path / "cluster"):
        yield Target("cluster", c.addr, leader_addr,
                     lambda name, parts: c.create_topic(name, parts), c)
