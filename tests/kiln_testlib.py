"""Process and CLI helpers shared by the real-client tests: the Broker
process wrapper, `kiln ...` CLI calls, topic creation, and librdkafka-based
read-back helpers.

The binary comes from $KILN_BIN (scripts/test sets it to target/debug/kiln);
without it, target/debug/kiln under the repo root is used.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 15.0
CLI_TIMEOUT_S = 30.0
LOG_TAIL_BYTES = 64 * 1024
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def kiln_bin() -> str:
    path = os.environ.get("KILN_BIN") or str(REPO_ROOT / "target" / "debug" / "kiln")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(
            f"kiln binary not found at {path}: build it with `cargo build -p kiln --bin kiln` "
            "or set KILN_BIN",
            pytrace=False,
        )
    return path


def clean_env() -> dict:
    """The caller's environment minus settings that would point kiln elsewhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("KILN_CONFIG", "KILN_BOOTSTRAP")}
    env.setdefault("RUST_BACKTRACE", "1")
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_accepts(host: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class Broker:
    """One `kiln broker` process; restartable on the same port and data dir."""

    def __init__(self, data_dir: Path, log_path: Path, port: int | None = None,
                 auto_create_topics: bool = False, node_id: int = 0,
                 config_path: Path | None = None):
        """With `config_path` the broker is started as `kiln broker --config FILE` and
        nothing else: the file must name the same listen port, data dir and node id."""
        self.bin = kiln_bin()
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.data_dir = data_dir
        self.log_path = log_path
        self.auto_create_topics = auto_create_topics
        self.node_id = node_id
        self.config_path = config_path
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.killed_by_test = False
        self.paused = False  # SIGSTOPped by the test and not yet SIGCONTed
        self.data_dir.mkdir(parents=True, exist_ok=True)

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        if self.config_path is not None:
            args = [self.bin, "broker", "--config", str(self.config_path)]
        else:
            args = [self.bin, "broker", "--listen", self.addr, "--data-dir", str(self.data_dir),
                    "--node-id", str(self.node_id)]
        if self.auto_create_topics:
            args.append("--auto-create-topics")
        self.starts += 1
        self.killed_by_test = False
        self.paused = False
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(args)}\n".encode())
            log.flush()
            env = clean_env()
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, env=env)
        self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise AssertionError(
                    f"kiln broker exited with status {rc} before accepting connections on "
                    f"{self.addr}\n{self.log_tail()}")
            if port_accepts(self.host, self.port):
                return
            time.sleep(0.05)
        raise AssertionError(
            f"kiln broker did not accept connections on {self.addr} within {timeout_s}s\n"
            f"{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def running(self) -> bool:
        """Alive and not paused: a process that can answer requests."""
        return self.alive() and not self.paused

    def kill9(self) -> None:
        """SIGKILL and reap: no shutdown hooks, no flush."""
        if self.proc is None:
            return
        self.killed_by_test = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.paused = False
        with open(self.log_path, "ab") as log:
            log.write(b"\n===== killed with SIGKILL by the test\n")

    def sigstop(self) -> None:
        """Freezes the process (SIGSTOP): its sockets stay open but nothing is answered."""
        assert self.alive(), f"cannot SIGSTOP a broker that is not running\n{self.log_tail()}"
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True
        with open(self.log_path, "ab") as log:
            log.write(b"\n===== paused with SIGSTOP by the test\n")

    def sigcont(self) -> None:
        """Resumes a process paused by sigstop()."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            with open(self.log_path, "ab") as log:
                log.write(b"\n===== resumed with SIGCONT by the test\n")
        self.paused = False

    def stop(self) -> int | None:
        """Graceful-ish stop for teardown: SIGTERM, then SIGKILL after 5 s."""
        if self.proc is None:
            return None
        if self.paused:
            self.sigcont()  # a stopped process would not act on SIGTERM
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def restart(self) -> None:
        self.kill9()
        self.start()

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def log_text(self) -> str:
        """The broker's log so far, ANSI colour codes removed."""
        try:
            return ANSI_RE.sub("", self.log_path.read_text(errors="replace"))
        except FileNotFoundError:
            return ""

    def wait_log(self, pattern: str, since: int = 0, timeout_s: float = 3.0) -> str:
        """Waits until the log after character `since` matches regex `pattern`; returns the match."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = re.search(pattern, self.log_text()[since:])
            if m:
                return m.group(0)
            if time.monotonic() >= deadline:
                raise AssertionError(f"no log line matching {pattern!r} within {timeout_s}s; log since "
                                     f"then:\n{self.log_text()[since:][-4000:]}")
            time.sleep(0.05)

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        text = self.log_text()
        if len(text) > limit:
            text = f"[... {len(text) - limit} bytes cut ...]\n" + text[-limit:]
        return f"--- kiln broker log ({self.log_path}) ---\n{text}--- end of broker log ---"

    def assert_alive(self) -> None:
        assert self.alive(), f"kiln broker died (status {self.proc.returncode})\n{self.log_tail()}"


# --------------------------------------------------------------------------
# CLI helpers


def kiln(*args: str, check: bool = True, timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Runs `kiln ARGS...`; with check, asserts exit status 0 and shows stderr if not."""
    cmd = [kiln_bin(), *args]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                            stdin=subprocess.DEVNULL, env=clean_env())
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"`{' '.join(cmd)}` did not finish within {timeout_s}s: "
                             f"stdout={e.stdout!r} stderr={e.stderr!r}") from None
    if check:
        assert cp.returncode == 0, (f"`{' '.join(cmd)}` exited {cp.returncode}\n"
                                    f"stdout: {cp.stdout}\nstderr: {cp.stderr}")
    return cp


def create_topic(broker: Broker, name: str, partitions: int = 1, configs: dict | None = None,
                 wait_visible: bool = True) -> None:
    """Creates a topic with `kiln topics create`, then waits until clients see it."""
    args = ["topics", "create", name, "--partitions", str(partitions),
            "--replication-factor", "1", "--bootstrap", broker.addr]
    for k, v in (configs or {}).items():
        args += ["--config", f"{k}={v}"]
    kiln(*args)
    if wait_visible:
        wait_topic_visible(broker, name, partitions)


def wait_topic_visible(broker: Broker, name: str, partitions: int, timeout_s: float = 10.0) -> None:
    """Polls Metadata (through librdkafka) until the topic has all partitions with a leader."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.addr, "broker.address.family": "v4"})
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(topic=name, timeout=5)
            t = md.topics.get(name)
            last = t
            if t is not None and t.error is None and len(t.partitions) == partitions and all(
                    p.leader >= 0 and p.error is None for p in t.partitions.values()):
                return
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(0.1)
    raise AssertionError(f"topic {name} with {partitions} partitions not visible in metadata "
                         f"within {timeout_s}s; last: {last!r}\n{broker.log_tail()}")


# --------------------------------------------------------------------------
# librdkafka (confluent-kafka) helpers

GROUP_ID_UNUSED = "kiln-test-unused"  # consumers only assign(); no group protocol is used
# librdkafka's own log lines go to Python logging (shown with a failing test)
# instead of straight to stderr.
RDKAFKA_LOG = logging.getLogger("rdkafka")


def rdk_producer_conf(broker: Broker, **overrides) -> dict:
    conf = {
        "bootstrap.servers": broker.addr,
        "broker.address.family": "v4",
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 15000,
        "logger": RDKAFKA_LOG,
    }
    conf.update(overrides)
    return conf


def rdk_producer(broker: Broker, **overrides):
    from confluent_kafka import Producer
    return Producer(rdk_producer_conf(broker, **overrides))


def rdk_consumer(broker: Broker, **overrides):
    from confluent_kafka import Consumer
    conf = {
        "bootstrap.servers": broker.addr,
        "broker.address.family": "v4",
        "group.id": GROUP_ID_UNUSED,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",  # never silently jump: an out-of-range offset is a bug here
        "fetch.wait.max.ms": 100,
        "logger": RDKAFKA_LOG,
    }
    conf.update(overrides)
    return Consumer(conf)


class Delivered:
    """Collects delivery reports: on_delivery=d.cb."""

    def __init__(self):
        self.ok = []      # confluent_kafka.Message, in callback order
        self.failed = []  # (KafkaError, Message)

    def cb(self, err, msg):
        if err is None:
            self.ok.append(msg)
        else:
            self.failed.append((err, msg))

    @property
    def count(self) -> int:
        return len(self.ok) + len(self.failed)


class RoundRobinWriter(threading.Thread):
    """Produces records "P:SEQ" keyed "kP" to partitions 0..partitions-1 of `topic` in turn,
    from a thread, until `stop` is set, pausing `pause_s` after every `burst` records. `sent[p]`
    lists partition p's values in the order sent; `on_delivery` gets every delivery report;
    an exception in the loop is kept in `error` for the test to report."""

    def __init__(self, producer, topic: str, partitions: int, on_delivery,
                 burst: int = 1, pause_s: float = 0.002):
        super().__init__(daemon=True)
        self.producer, self.topic, self.partitions = producer, topic, partitions
        self.on_delivery, self.burst, self.pause_s = on_delivery, burst, pause_s
        self.sent: list[list[bytes]] = [[] for _ in range(partitions)]
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        try:
            n = 0
            while not self.stop.is_set():
                p = n % self.partitions
                value = f"{p}:{len(self.sent[p])}".encode()
                self.producer.produce(self.topic, value=value, key=f"k{p}".encode(), partition=p,
                                      on_delivery=self.on_delivery)
                self.sent[p].append(value)
                n += 1
                self.producer.poll(0)
                if n % self.burst == 0:
                    time.sleep(self.pause_s)
        except BaseException as e:  # reported by the test
            self.error = e


def flush_all(producer, expected: int, delivered: Delivered, timeout_s: float = 30.0) -> None:
    remaining = producer.flush(timeout_s)
    assert remaining == 0, f"{remaining} messages still queued after flush({timeout_s})"
    assert delivered.count == expected, f"{delivered.count} delivery reports for {expected} messages"


class Rec:
    __slots__ = ("partition", "offset", "key", "value", "timestamp")

    def __init__(self, partition, offset, key, value, timestamp):
        self.partition, self.offset, self.key, self.value, self.timestamp = (
            partition, offset, key, value, timestamp)

    def __repr__(self):
        return f"Rec(p={self.partition}, o={self.offset}, k={self.key!r}, v={self.value!r}, ts={self.timestamp})"


def watermarks(broker: Broker, topic: str, partition: int, consumer=None) -> tuple[int, int]:
    from confluent_kafka import TopicPartition
    own = consumer is None
    c = consumer or rdk_consumer(broker)
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
    finally:
        if own:
            c.close()


def read_values(broker: Broker, topic: str, partitions: int, expected: int,
                timeout_s: float = 30.0, **conf) -> list[str]:
    """Values of every partition of `topic` from offset 0, read with an assigned librdkafka
    consumer (`conf` adds settings: TLS, SASL) until `expected` arrived or `timeout_s` passed.
    Fails on any consumer error."""
    from confluent_kafka import TopicPartition
    c = rdk_consumer(broker, **conf)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: list[str] = []
        deadline = time.monotonic() + timeout_s
        while len(values) < expected and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert not m.error(), m.error()
            values.append(m.value().decode())
        return values
    finally:
        c.close()


def read_partition(broker: Broker, topic: str, partition: int, start: int = 0,
                   end: int | None = None, timeout_s: float = 20.0) -> list[Rec]:
    """Reads [start, end) of one partition with an assigned librdkafka consumer.

    end defaults to the current high watermark. Fails on any consumer error
    and if the range is not complete within timeout_s."""
    from confluent_kafka import KafkaError, TopicPartition

    c = rdk_consumer(broker)
    try:
        if end is None:
            _, end = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10,
                                             cached=False)
        out: list[Rec] = []
        if end <= start:
            return out
        c.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error on {topic}/{partition}: {msg.error()}")
            out.append(Rec(msg.partition(), msg.offset(), msg.key(), msg.value(),
                           msg.timestamp()[1]))
            if msg.offset() >= end - 1:
                return out
        raise AssertionError(
            f"read {topic}/{partition} [{start}, {end}): got {len(out)} records within "
            f"{timeout_s}s, last offset {out[-1].offset if out else None}")
    finally:
        c.close()


def assert_contiguous(recs: list[Rec], start: int) -> None:
    offsets = [r.offset for r in recs]
    assert offsets == list(range(start, start + len(recs))), (
        f"offsets not contiguous from {start}: {offsets[:20]}...")


def resolve_implicit_acks(acked: dict[tuple[str, int], tuple[int, int | None]],
                          where: dict[tuple[str, int], list[tuple[int, int]]]):
    """librdkafka reports a batch whose own answer it lost (a request that timed out or whose
    connection broke) as delivered once a later batch of the same producer is acknowledged, the
    broker having taken the sequences in order: the record is written, but its offset (None)
    unknown. Such a record must still be in its partition exactly once, so its offset is taken
    from the log; one not found keeps None and counts as lost. Returns (acked, how many)."""
    resolved, implicit = {}, 0
    for ks, (p, offset) in acked.items():
        if offset is None:
            implicit += 1
            found = [o for q, o in where.get(ks, []) if q == p]
            offset = found[0] if found else None
        resolved[ks] = (p, offset)
    return resolved, implicit


def rdk_sasl(pki: Path, user: str, password: str,
             mechanism: str = "SCRAM-SHA-512") -> dict:
    """librdkafka settings for SASL_SSL with the CA `kiln certs ca` made under `pki`."""
    return {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki / "ca" / "ca.crt"),
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def wait_for_login(broker: Broker, pki: Path, user: str, password: str,
                   timeout_s: float = 20.0) -> None:
    """The bootstrap user's credential is written through the metadata log a moment after the
    listener opens: wait until it logs in."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka import KafkaException
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        admin = AdminClient({"bootstrap.servers": broker.addr, **rdk_sasl(pki, user, password)})
        try:
            admin.list_topics(timeout=3)
            return
        except KafkaException as e:
            last = e
        time.sleep(0.2)
    raise AssertionError(f"the bootstrap user cannot log in: {last}\n{broker.log_tail()}")


def broker_pki(root: Path) -> Path:
    """A CA (`kiln certs ca`) under root/ca and node 0's certificate for 127.0.0.1 under
    root/certs: what a one-broker `[tls]` test serves. Returns root."""
    kiln("certs", "ca", "--dir", str(root / "ca"))
    kiln("certs", "broker", "--ca-dir", str(root / "ca"), "--node", "0",
         "--host", "127.0.0.1", "--out", str(root / "certs"))
    return root
