"""Three `kiln broker` processes on loopback forming one replicated cluster.

`Cluster` writes one TOML file per node (same peer list everywhere, its own
`node_id`, Kafka port, Raft port and data dir), starts every node with
`kiln broker --config FILE`, and lets a test kill -9, SIGSTOP/SIGCONT and
restart nodes one by one on the same ports and data dirs.

What the cluster thinks is read straight from each broker, one at a time,
with hand-built requests (kafka_raw framing): Metadata v7, because it is the
first version that carries each partition's leader epoch (the Raft term),
which librdkafka does not expose, and FindCoordinator v0. A paused (SIGSTOPped)
or dead node is never asked. `leader_of` takes, among the answers, the one with
the highest leader epoch, so a node that has not yet heard of a newer term
cannot mislead it. Every (partition, epoch) -> leader pair ever seen is kept,
and `epoch_conflicts()` lists epochs for which two brokers named different
leaders (invariant 5: at most one leader per partition per epoch).

A `Cluster` has an `addr` (all three Kafka addresses, comma separated) and a
`log_tail()`, so the kiln_testlib functions that take a Broker (rdk_producer,
rdk_consumer, read_partition, watermarks) take a Cluster too.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import kafka_raw as kr
from kiln_testlib import RDKAFKA_LOG, Broker, free_port

CLUSTER_SIZE = 3
# Raft timing: the values the shipped configuration uses (deploy/cluster/broker-*.toml), so
# failover times measured here are the ones operators get.
HEARTBEAT_MS = 100
ELECTION_TIMEOUT_MIN_MS = 300
ELECTION_TIMEOUT_MAX_MS = 600
ASK_TIMEOUT_S = 1.0          # one raw request to one broker
FORM_TIMEOUT_S = 30.0        # a fresh cluster electing its controller
LEADERS_TIMEOUT_S = 30.0     # every partition of a topic led, seen by every running broker
LOG_TAIL_PER_NODE = 6000

# Errors after which CreateTopics is simply sent again (the controller is moving or
# not elected yet, or the request raced an election).
CREATE_RETRIABLE = {"NOT_CONTROLLER", "LEADER_NOT_AVAILABLE", "REQUEST_TIMED_OUT", "_TIMED_OUT",
                    "_TRANSPORT", "BROKER_NOT_AVAILABLE", "COORDINATOR_NOT_AVAILABLE",
                    "NOT_COORDINATOR", "_ALL_BROKERS_DOWN", "NOT_LEADER_FOR_PARTITION",
                    "NOT_ENOUGH_REPLICAS", "_WAIT_COORD"}

NONE_ERROR = 0
COORDINATOR_NOT_AVAILABLE = 15


@dataclass(frozen=True)
class PartitionState:
    error: int
    leader: int
    epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass
class BrokerView:
    """One broker's Metadata v7 answer."""
    asked: int                                  # node id of the broker that answered
    brokers: dict[int, str]                     # node id -> host:port
    controller: int
    topics: dict[str, tuple[int, dict[int, PartitionState]]] = field(default_factory=dict)
    cluster_id: str | None = None                # None until the cluster is named


def metadata_v7(conn: kr.Conn, topics: list[str] | None) -> tuple[dict[int, str], int, dict, str | None]:
    """Metadata v7 (non-flexible): brokers, controller id, per-partition leader epochs and the
    cluster id.

    Request: topics (nullable array of names), allow_auto_topic_creation (bool).
    Response: throttle_time_ms, brokers[node_id, host, port, rack], cluster_id, controller_id,
    topics[error_code, name, is_internal, partitions[error_code, index, leader_id, leader_epoch,
    replica_nodes[], isr_nodes[], offline_replicas[]]]."""
    body = (kr.i32(-1) if topics is None else kr.array([kr.string(t) for t in topics])) + kr.i8(0)
    r = conn.request(kr.METADATA, 7, body)
    r.i32()  # throttle_time_ms
    brokers = {}
    for _ in range(r.i32()):
        node, host, port, _rack = r.i32(), r.string(), r.i32(), r.string()
        brokers[node] = f"{host}:{port}"
    cluster_id = r.string()
    controller = r.i32()
    out = {}
    for _ in range(r.i32()):
        terr, name, _internal = r.i16(), r.string(), r.i8()
        parts = {}
        for _ in range(r.i32()):
            perr, index, leader, epoch = r.i16(), r.i32(), r.i32(), r.i32()
            replicas = tuple(r.i32() for _ in range(r.i32()))
            isr = tuple(r.i32() for _ in range(r.i32()))
            [r.i32() for _ in range(r.i32())]  # offline_replicas
            parts[index] = PartitionState(perr, leader, epoch, replicas, isr)
        out[name] = (terr, parts)
    return brokers, controller, out, cluster_id


def find_coordinator_v0(conn: kr.Conn, group: str) -> tuple[int, int]:
    """FindCoordinator v0 for a consumer group: (error_code, coordinator node id)."""
    r = conn.request(kr.FIND_COORDINATOR, 0, kr.string(group))
    err, node = r.i16(), r.i32()
    r.string()  # host
    r.i32()     # port
    return err, node


class Cluster:
    """CLUSTER_SIZE brokers with node ids 1..N; `nodes[id]` is a kiln_testlib.Broker."""

    def __init__(self, root: Path, size: int = CLUSTER_SIZE, settings: dict | None = None,
                 cluster_settings: dict | None = None, metrics: bool = False,
                 extra_config=None, peer_listeners=None):
        """`settings`: extra top-level broker settings (TOML scalars) for every node;
        `cluster_settings`: extra or overriding keys of the [cluster] section; `metrics`:
        each node serves GET /metrics on its own free loopback port (`metrics_port`,
        `scrape`) instead of none; `extra_config(node_id)`: TOML text appended to that node's
        file (whole tables, such as `[cluster.tls]`); `peer_listeners(node_id)`: that node's
        `{listener name: host:port}` for its `[[cluster.peers]]` entry in every file."""
        self.extra_config = extra_config
        self.peer_listeners = peer_listeners or (lambda node_id: {})
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.size = size
        self.settings = dict(settings or {})
        self.cluster_settings = {
            "default_replication_factor": min(3, size),
            "heartbeat_ms": HEARTBEAT_MS,
            "election_timeout_min_ms": ELECTION_TIMEOUT_MIN_MS,
            "election_timeout_max_ms": ELECTION_TIMEOUT_MAX_MS,
        }
        self.cluster_settings.update(cluster_settings or {})
        ports: list[int] = []
        while len(ports) < (3 if metrics else 2) * size:
            p = free_port()
            if p not in ports:
                ports.append(p)
        self.ids = list(range(1, size + 1))
        self.kafka_port = {i: ports[2 * (i - 1)] for i in self.ids}
        self.raft_port = {i: ports[2 * (i - 1) + 1] for i in self.ids}
        self.metrics_port = {i: ports[2 * size + i - 1] for i in self.ids} if metrics else {}
        self.nodes: dict[int, Broker] = {}
        for i in self.ids:
            data_dir = root / f"b{i}"
            config_path = root / f"b{i}.toml"
            config_path.write_text(self.render_config(i, data_dir))
            self.nodes[i] = Broker(data_dir, root / f"b{i}.log", port=self.kafka_port[i],
                                   node_id=i, config_path=config_path)
        self._lock = threading.Lock()
        self._leaders_seen: dict[tuple[str, int, int], set[int]] = {}
        self.last_views: dict[int, BrokerView | str] = {}

    # ------------------------------------------------------------------ configuration

    def render_config(self, node_id: int, data_dir: Path) -> str:
        def toml(v) -> str:
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, (int, float)):
                return str(v)
            return json.dumps(str(v))  # a TOML basic string for paths and addresses

        lines = [
            f"node_id = {node_id}",
            f"listen = {toml(f'127.0.0.1:{self.kafka_port[node_id]}')}",
            f"data_dir = {toml(data_dir)}",
            f"metrics_listen = {toml(f'127.0.0.1:{self.metrics_port[node_id]}')}"
            if node_id in self.metrics_port else 'metrics_listen = "off"',
        ]
        lines += [f"{k} = {toml(v)}" for k, v in self.settings.items()]
        lines += ["", "[cluster]", f"raft_listen = {toml(f'127.0.0.1:{self.raft_port[node_id]}')}"]
        lines += [f"{k} = {toml(v)}" for k, v in self.cluster_settings.items()]
        for i in self.ids:
            lines += ["", "[[cluster.peers]]", f"id = {i}",
                      f"kafka = {toml(f'127.0.0.1:{self.kafka_port[i]}')}",
                      f"raft = {toml(f'127.0.0.1:{self.raft_port[i]}')}"]
            listeners = self.peer_listeners(i)
            if listeners:
                pairs = ", ".join(f"{toml(k)} = {toml(v)}" for k, v in listeners.items())
                lines.append(f"listeners = {{ {pairs} }}")
        if self.extra_config is not None:
            lines += ["", self.extra_config(node_id)]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ processes

    @property
    def addr(self) -> str:
        """Bootstrap list naming every node."""
        return ",".join(self.nodes[i].addr for i in self.ids)

    def node(self, node_id: int) -> Broker:
        return self.nodes[node_id]

    def add_joiner(self, node_id: int) -> Broker:
        """A new broker `node_id` that joins the running cluster (`[cluster] join = true`):
        its file lists every node so far as a seed plus itself; the others' files are left as
        they are. Not started."""
        assert node_id not in self.ids, node_id
        ports: list[int] = []
        taken = set(self.kafka_port.values()) | set(self.raft_port.values())
        while len(ports) < 2:
            p = free_port()
            if p not in taken and p not in ports:
                ports.append(p)
        self.ids.append(node_id)
        self.kafka_port[node_id], self.raft_port[node_id] = ports
        data_dir = self.root / f"b{node_id}"
        config_path = self.root / f"b{node_id}.toml"
        saved = dict(self.cluster_settings)
        self.cluster_settings["join"] = True
        try:
            config_path.write_text(self.render_config(node_id, data_dir))
        finally:
            self.cluster_settings = saved
        self.nodes[node_id] = Broker(data_dir, self.root / f"b{node_id}.log",
                                     port=self.kafka_port[node_id], node_id=node_id,
                                     config_path=config_path)
        return self.nodes[node_id]

    def forget(self, node_id: int) -> None:
        """Drops a node the test stopped for good (decommissioned) from `ids`."""
        assert not self.nodes[node_id].alive(), node_id
        self.ids.remove(node_id)

    def running_ids(self) -> list[int]:
        return [i for i in self.ids if self.nodes[i].running()]

    def start(self, node_id: int | None = None) -> None:
        """Starts one node (or every node that is not running) and waits until its Kafka
        port accepts connections."""
        for i in [node_id] if node_id is not None else self.ids:
            b = self.nodes[i]
            if not b.alive():
                b.start()

    def start_all(self, form_timeout_s: float = FORM_TIMEOUT_S) -> None:
        """Starts every node, then waits until they agree on a controller and list each other."""
        self.start()
        self.wait_formed(form_timeout_s)

    def kill9(self, node_id: int) -> None:
        self.nodes[node_id].kill9()

    def restart(self, node_id: int) -> None:
        self.nodes[node_id].kill9()
        self.nodes[node_id].start()

    def sigstop(self, node_id: int) -> None:
        self.nodes[node_id].sigstop()

    def sigcont(self, node_id: int) -> None:
        self.nodes[node_id].sigcont()

    def heal(self) -> None:
        """Resumes paused nodes and starts dead ones."""
        for i in self.ids:
            b = self.nodes[i]
            if b.paused:
                b.sigcont()
            if not b.alive():
                b.start()

    def close(self) -> list[str]:
        """Stops every node; returns a line for each node that had exited on its own."""
        died = []
        for i in self.ids:
            b = self.nodes[i]
            if b.proc is not None and b.proc.poll() is not None and not b.killed_by_test:
                died.append(f"node {i} ({b.addr}) exited on its own with status {b.proc.returncode}")
            b.stop()
        return died

    def assert_alive(self) -> None:
        for i in self.ids:
            self.nodes[i].assert_alive()

    def log_tail(self, limit: int = LOG_TAIL_PER_NODE) -> str:
        return "\n".join(f"[node {i}]\n{self.nodes[i].log_tail(limit)}" for i in self.ids)

    # ------------------------------------------------------------------ what the brokers say

    def view(self, node_id: int, topics: list[str] | None = None,
             timeout_s: float = ASK_TIMEOUT_S) -> BrokerView:
        """Asks one broker for Metadata v7; raises OSError/ValueError/ConnectionClosed."""
        with kr.Conn(self.nodes[node_id].addr, timeout_s=timeout_s) as conn:
            brokers, controller, parsed, cluster_id = metadata_v7(conn, topics)
        v = BrokerView(node_id, brokers, controller, parsed, cluster_id)
        with self._lock:
            for name, (terr, parts) in parsed.items():
                if terr != NONE_ERROR:
                    continue
                for index, st in parts.items():
                    if st.error == NONE_ERROR and st.leader >= 0:
                        self._leaders_seen.setdefault((name, index, st.epoch), set()).add(st.leader)
        return v

    def views(self, topics: list[str] | None = None) -> dict[int, BrokerView]:
        """Metadata from every running node that answers within ASK_TIMEOUT_S."""
        out: dict[int, BrokerView] = {}
        for i in self.running_ids():
            try:
                out[i] = self.view(i, topics)
                self.last_views[i] = out[i]
            except (OSError, ValueError, AssertionError, kr.ConnectionClosed) as e:
                self.last_views[i] = f"no answer: {e!r}"
        return out

    def scrape(self, node_id: int, timeout_s: float = ASK_TIMEOUT_S) -> dict[tuple, float]:
        """One node's GET /metrics (needs `metrics=True`), parsed with prometheus_client:
        {(sample name, ((label, value), ...) sorted): value}. Raises OSError when the node
        does not answer."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.metrics_port[node_id]}/metrics"
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            text = r.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def high_watermark(self, node_id: int, topic: str, partition: int) -> int | None:
        """`kiln_log_high_watermark` of one node's replica of topic/partition (its applied
        position as a Kafka offset); None when the node does not answer or holds none."""
        try:
            v = self.scrape(node_id).get(("kiln_log_high_watermark",
                                          (("partition", str(partition)), ("topic", topic))))
        except (OSError, ValueError):
            return None
        return None if v is None else int(v)

    def topic_id(self, topic: str, node_id: int | None = None) -> str:
        """The topic's id (the directory under `data_dir/replicas/` that holds its
        partitions), from the last "topic open" line a node logged for that name (a topic
        deleted and created again has a new id)."""
        pattern = re.compile(r"topic open topic=(\S+) id=(\S+)")
        for i in [node_id] if node_id is not None else self.ids:
            ids = [m.group(2) for m in pattern.finditer(self.nodes[i].log_text())
                   if m.group(1) == topic]
            if ids:
                return ids[-1]
        raise AssertionError(f"no node logged the creation of topic {topic}\n{self.log_tail()}")

    def replica_dir(self, node_id: int, topic: str, partition: int) -> Path:
        """Where a node keeps its replica of topic/partition (its log segments, `vote`, `state`)."""
        return self.nodes[node_id].data_dir / "replicas" / self.topic_id(topic) / str(partition)

    def epoch_conflicts(self) -> dict[tuple[str, int, int], set[int]]:
        """(topic, partition, epoch) -> leaders, for every epoch some two brokers disagreed on."""
        with self._lock:
            return {k: set(v) for k, v in self._leaders_seen.items() if len(v) > 1}

    def leader_of(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(leader id, leader epoch) from the running broker that knows the highest epoch
        with a leader; None while no running broker names one."""
        best = None
        for v in self.views([topic]).values():
            terr, parts = v.topics.get(topic, (-1, {}))
            st = parts.get(partition)
            if terr != NONE_ERROR or st is None or st.error != NONE_ERROR or st.leader < 0:
                continue
            if best is None or st.epoch > best[1]:
                best = (st.leader, st.epoch)
        return best

    def wait_leader(self, topic: str, partition: int, exclude: int | None = None,
                    timeout_s: float = LEADERS_TIMEOUT_S) -> tuple[int, int]:
        """Waits until some running broker names a running leader (other than `exclude`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.leader_of(topic, partition)
            if found and found[0] != exclude and self.nodes.get(found[0]) is not None \
                    and self.nodes[found[0]].running():
                return found
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{topic}/{partition}: no running leader{'' if exclude is None else f' other than {exclude}'}"
                    f" within {timeout_s}s; last: {found}; views: {self.describe_views()}\n"
                    f"{self.log_tail()}")
            time.sleep(0.05)

    def wait_leaders(self, topic: str, partitions: int, timeout_s: float = LEADERS_TIMEOUT_S,
                     agree: bool = True) -> dict[int, tuple[int, int]]:
        """Waits until every running broker reports a leader for every partition of `topic`
        (and, with `agree`, the same leader and epoch among those holding a replica, the
        leader being a running node).
        Returns {partition: (leader, epoch)} as the highest-epoch answer has it."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            running = self.running_ids()
            views = self.views([topic])
            problem = None
            if not views:
                problem = "no running broker answered"
            elif set(views) != set(running):
                problem = f"nodes {sorted(set(running) - set(views))} did not answer"
            best: dict[int, tuple[int, int]] = {}
            for i, v in views.items():
                if problem:
                    break
                terr, parts = v.topics.get(topic, (-1, {}))
                if terr != NONE_ERROR:
                    problem = f"node {i}: topic error {terr}"
                    break
                if sorted(parts) != list(range(partitions)):
                    problem = f"node {i}: partitions {sorted(parts)}"
                    break
                for p, st in parts.items():
                    if st.error != NONE_ERROR or st.leader < 0:
                        problem = f"node {i}: partition {p} error {st.error} leader {st.leader}"
                        break
                    if p not in best or st.epoch > best[p][1]:
                        best[p] = (st.leader, st.epoch)
            if not problem and agree:
                for p, (leader, epoch) in best.items():
                    # A broker holding no replica names the preferred one with epoch -1: a
                    # hint, not a view of the partition's elections.
                    said = {i: (v.topics[topic][1][p].leader, v.topics[topic][1][p].epoch)
                            for i, v in views.items() if v.topics[topic][1][p].epoch >= 0}
                    if any(s != (leader, epoch) for s in said.values()):
                        problem = f"partition {p}: brokers disagree {said}"
                        break
                    if leader not in running:
                        problem = f"partition {p}: leader {leader} is not running"
                        break
            if not problem:
                return best
            last = problem
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{topic}: not every partition led within {timeout_s}s ({last}); views: "
                    f"{self.describe_views()}\n{self.log_tail()}")
            time.sleep(0.05)

    def wait_formed(self, timeout_s: float = FORM_TIMEOUT_S) -> int:
        """Waits until every running node lists every node, names the same running controller
        and reports the same cluster id (the first controller names the cluster a moment after
        its election); returns the controller's id."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            running = self.running_ids()
            views = self.views([])
            controllers = {i: v.controller for i, v in views.items()}
            listed = {i: sorted(v.brokers) for i, v in views.items()}
            named = {i: v.cluster_id for i, v in views.items()}
            if (views and set(views) == set(running) and len(set(controllers.values())) == 1
                    and next(iter(controllers.values())) in running
                    and all(ids == self.ids for ids in listed.values())
                    and len(set(named.values())) == 1 and None not in named.values()):
                return next(iter(controllers.values()))
            last = (f"controllers {controllers}, brokers listed {listed}, cluster ids {named}, "
                    f"running {running}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"cluster not formed within {timeout_s}s: {last}\n{self.log_tail()}")
            time.sleep(0.1)

    def controller(self) -> int:
        """The controller (leader of the cluster metadata group) as the running brokers
        report it; -1 unless every running broker that answers names the same one."""
        said = {v.controller for v in self.views([]).values()}
        return said.pop() if len(said) == 1 else -1

    def coordinator(self, group: str, timeout_s: float = LEADERS_TIMEOUT_S) -> int:
        """The group coordinator's node id, once every running broker answers FindCoordinator
        with the same running node."""
        deadline = time.monotonic() + timeout_s
        last: dict = {}
        while True:
            running = self.running_ids()
            answers: dict[int, tuple[int, int] | str] = {}
            for i in running:
                try:
                    with kr.Conn(self.nodes[i].addr, timeout_s=ASK_TIMEOUT_S) as conn:
                        answers[i] = find_coordinator_v0(conn, group)
                except (OSError, ValueError, AssertionError, kr.ConnectionClosed) as e:
                    answers[i] = f"no answer: {e!r}"
            nodes = {a[1] for a in answers.values() if isinstance(a, tuple) and a[0] == NONE_ERROR}
            if (answers and len(answers) == len(running) and len(nodes) == 1
                    and all(isinstance(a, tuple) and a[0] == NONE_ERROR for a in answers.values())
                    and next(iter(nodes)) in running):
                return next(iter(nodes))
            last = answers
            if time.monotonic() >= deadline:
                raise AssertionError(f"group {group}: no agreed running coordinator within {timeout_s}s; "
                                     f"answers (error, node): {last}\n{self.log_tail()}")
            time.sleep(0.05)

    def describe_views(self) -> str:
        parts = []
        for i in self.ids:
            v = self.last_views.get(i)
            if isinstance(v, BrokerView):
                topics = {name: {p: (s.leader, s.epoch, s.error) for p, s in ps.items()}
                          for name, (_, ps) in v.topics.items()}
                parts.append(f"node {i}: controller {v.controller}, (leader, epoch, error) {topics}")
            else:
                parts.append(f"node {i}: {v}")
        return "; ".join(parts)

    # ------------------------------------------------------------------ admin

    def admin(self):
        from confluent_kafka.admin import AdminClient
        return AdminClient({"bootstrap.servers": self.addr, "broker.address.family": "v4",
                            "logger": RDKAFKA_LOG})

    def create_topic(self, name: str, partitions: int, replication_factor: int = 3,
                     configs: dict | None = None, timeout_s: float = 30.0) -> dict[int, tuple[int, int]]:
        """CreateTopics through librdkafka's AdminClient (which sends it to the controller),
        retried while the controller is moving; then waits until every running broker
        reports a leader for every partition. Returns {partition: (leader, epoch)}."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        admin = self.admin()
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while True:
            attempt += 1
            fs = admin.create_topics([NewTopic(name, partitions, replication_factor,
                                               config=dict(configs or {}))],
                                     operation_timeout=10, request_timeout=10)
            try:
                fs[name].result(timeout=20)
                break
            except KafkaException as e:
                err = e.args[0]
                if err.name() == "TOPIC_ALREADY_EXISTS" and attempt > 1:
                    break  # an earlier attempt created it; its answer was lost
                if err.name() not in CREATE_RETRIABLE or time.monotonic() >= deadline:
                    raise AssertionError(f"creating topic {name} failed after {attempt} attempt(s): "
                                         f"{err}\n{self.log_tail()}") from None
            time.sleep(0.2)
        return self.wait_leaders(name, partitions, timeout_s=timeout_s)


def cluster_fixture(request, root: Path, **kw):
    """Body of a pytest fixture: a started, formed cluster; stopped afterwards, and the test
    fails if a node exited without being killed by it. Broker logs are attached to failures
    (conftest.py's report hook reads `request.node.kiln_brokers`)."""
    c = Cluster(root, **kw)
    request.node.kiln_brokers = [c.nodes[i] for i in c.ids]
    try:
        c.start_all()
        yield c
    finally:
        died = c.close()
    if died:
        pytest.fail("kiln broker died during the test: " + "; ".join(died), pytrace=False)
