"""Helpers for the consumer-group tests: a broker started with group settings, the
groups_consumer.py subprocess wrapper, numbered produce, committed offsets and /metrics."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from kiln_testlib import Broker, clean_env, free_port, rdk_producer

TESTS_DIR = Path(__file__).resolve().parent
CONSUMER_SCRIPT = TESTS_DIR / "groups_consumer.py"


def start_group_broker(make_broker, monkeypatch, **settings) -> Broker:
    """Starts a broker with its metrics endpoint on a free port (b.metrics_port) and any broker
    settings given as keyword arguments (passed as KILN_BROKER__<NAME> environment variables)."""
    port = free_port()
    monkeypatch.setenv("KILN_BROKER__METRICS_LISTEN", f"127.0.0.1:{port}")
    for name, value in settings.items():
        monkeypatch.setenv(f"KILN_BROKER__{name.upper()}", str(value))
    b = make_broker()
    b.metrics_port = port
    return b


def produce_numbered(broker: Broker, topic: str, partitions: int, per_partition: int,
                     timestamp_ms=None) -> None:
    """Writes `per_partition` records to each partition, values "p<partition>-<seq>"."""
    p = rdk_producer(broker, acks="all", **{"linger.ms": 0})
    failed = []

    def cb(err, _msg):
        if err is not None:
            failed.append(err)

    for seq in range(per_partition):
        for part in range(partitions):
            kw = {}
            if timestamp_ms is not None:
                kw["timestamp"] = timestamp_ms(part, seq) if callable(timestamp_ms) else timestamp_ms
            p.produce(topic, value=f"p{part}-{seq}", partition=part, on_delivery=cb, **kw)
        p.poll(0)
    assert p.flush(30) == 0, "produce did not finish"
    assert not failed, f"delivery failures: {failed[:3]}"


def committed(broker: Broker, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets as librdkafka reads them (-1001 = none)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": broker.addr, "broker.address.family": "v4",
                  "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def metrics(broker: Broker) -> dict[str, float]:
    """GET /metrics as {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def metric(broker: Broker, name: str, group: str, topic: str, partition: int) -> float | None:
    return metrics(broker).get(f'{name}{{group="{group}",topic="{topic}",partition="{partition}"}}')


class Event:
    __slots__ = ("t", "kind", "args")

    def __init__(self, t: float, kind: str, args: list[str]):
        self.t, self.kind, self.args = t, kind, args

    def __repr__(self):
        return f"{self.kind}({' '.join(self.args)})@{self.t:.3f}"


class Worker:
    """One groups_consumer.py process; its events are collected by a reader thread."""

    def __init__(self, broker: Broker, client: str, group: str, topic: str, log_dir: Path,
                 name: str = "worker", **opts):
        self.name = name
        args = [sys.executable, str(CONSUMER_SCRIPT), "--client", client, "--bootstrap", broker.addr,
                "--group", group, "--topic", topic, "--client-id", name]
        for k, v in opts.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        self.stderr_path = log_dir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL, env=clean_env(), text=True)
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) < 2:
                continue
            with self._lock:
                self.events.append(Event(float(parts[0]), parts[1], parts[2:]))

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.snapshot() if e.kind == kind]

    def wait_for(self, predicate, timeout_s: float = 30.0, what: str = "condition"):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = predicate(self)
            if result:
                return result
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) waiting for {what}; "
                                     f"stderr: {self.stderr_tail()}")
            time.sleep(0.02)
        raise AssertionError(f"{self.name}: no {what} within {timeout_s}s; last events: "
                             f"{self.snapshot()[-10:]}; stderr: {self.stderr_tail()}")

    def processed(self) -> list[tuple[int, int]]:
        return [(int(e.args[0]), int(e.args[1])) for e in self.of("PROCESSED")]

    def last_committed(self) -> dict[int, int]:
        out = {}
        for e in self.of("COMMITTED"):
            out[int(e.args[0])] = int(e.args[1])
        return out

    def assigned(self) -> set[int]:
        """Partitions held now, from the ASSIGNED/REVOKED events (eager or incremental)."""
        held: set[int] = set()
        for e in self.snapshot():
            if e.kind not in ("ASSIGNED", "REVOKED"):
                continue
            parts = {int(p) for p in e.args[0].split(",") if p != "-"}
            held = held | parts if e.kind == "ASSIGNED" else held - parts
        return held

    def kill9(self) -> float:
        t = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        return t

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        self._stderr.close()

    def stderr_tail(self, limit: int = 3000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-limit:]
        except FileNotFoundError:
            return ""


def describe_cli(broker: Broker, group: str) -> str:
    from kiln_testlib import kiln
    return kiln("groups", "describe", group, "--bootstrap", broker.addr).stdout


def parse_describe_rows(text: str) -> dict[tuple[str, int], dict]:
    """The per-partition table of `kiln groups describe`."""
    rows = {}
    in_table = False
    for line in text.splitlines():
        if line.startswith("TOPIC"):
            in_table = True
            continue
        if in_table and line.strip():
            f = line.split()
            if len(f) < 7:
                continue
            rows[(f[0], int(f[1]))] = {"committed": f[2], "end": f[3], "lag": f[4], "lag_s": f[5], "owner": f[6]}
    return rows


def log_position(broker: Broker, pattern: str) -> int:
    """Character position of the first broker log line matching `pattern` (-1 if none)."""
    m = re.search(pattern, broker.log_text())
    return m.start() if m else -1


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default
