"""`kiln deadletter` end to end, against a real SMTP server (aiosmtpd) on loopback.

A broker, `kiln intake register` of three nodes in two racks and a real `kiln agent` whose
scripted playbook always fails two of them (tiny retry back-off): after ten attempts each the
agent dead-letters them onto kiln.nodes.dlq. `kiln deadletter` consumes the topic, records
triage in the store and sends the daily report as soon as it has caught up (the report time is
already past in the chosen zone). The delivered email is read back from the SMTP server and
both parts are checked. Then `kiln deadletter report --send-now` and a restarted service must
not send a second email the same day. A second test sends over STARTTLS with authentication
(a CA and certificate made with openssl). A third runs `kiln sim` with its row-remap, Xid 79 and
InfiniBand faults under a real agent and checks that each node's action, component and evidence
are in both parts of the delivered email, the row-remap failure after one attempt.
"""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import json
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

import kafka_raw
from kiln_testlib import create_topic, free_port, kiln, kiln_bin, clean_env, rdk_consumer

try:
    import aiosmtpd.controller as aiosmtpd_controller
except ImportError as e:  # fail, not skip: these tests are the report email's end-to-end proof
    raise ImportError("aiosmtpd is missing: run scripts/install-test-deps "
                      "(tests/requirements.txt pins it)") from e

# Scripted failures carry no findings: the report's fallback names the part from the check's
# name and the action from its words.
FAILING = {
    "gpu-e-01": ("rack-east", "10.20.0.11", "gpu_ecc",
                 "GPU 3 (0000:1b:00.0): 12 uncorrected volatile ECC errors", "investigate"),
    "gpu-w-01": ("rack-west", "10.20.1.11", "infiniband",
                 "mlx5_2 port 1: state DOWN, expected ACTIVE", "reseat cable/transceiver"),
}
PASSING = ("gpu-w-02", "rack-west", "10.20.1.12")


class Inbox:
    """aiosmtpd handler: keeps every message it accepts."""

    def __init__(self):
        self.messages: list[bytes] = []
        self.logins: list[str] = []
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        with self.lock:
            self.messages.append(envelope.original_content or envelope.content)
        return "250 Message accepted for delivery"

    def count(self) -> int:
        with self.lock:
            return len(self.messages)

    def wait(self, n: int, timeout_s: float, why) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count() < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.count()} email(s) within {timeout_s}s, wanted {n}\n{why()}")
            time.sleep(0.1)


def noon_zone() -> str:
    """An IANA zone where it is now about noon, so a report time of 00:00 is past and the local
    day does not change during the test."""
    hour = dt.datetime.now(dt.timezone.utc).hour
    offset = max(-12, min(14, 12 - hour))
    # Etc/GMT signs are inverted: Etc/GMT-5 is UTC+5.
    return "Etc/GMT" if offset == 0 else f"Etc/GMT{-offset:+d}"


def write_config(path: Path, broker, db_url: str, smtp_port: int, extra_smtp: str = "") -> Path:
    path.write_text(
        f'bootstrap = "{broker.addr}"\ndatabase_url = "{db_url}"\ninstance_id = "dl-test"\n'
        f'catch_up_timeout_ms = 30000\nsession_timeout_ms = 6000\ntransport = "smtp"\n'
        f'[report]\ntime = "00:00"\ntimezone = "{noon_zone()}"\n'
        f'from = "Kiln <kiln@example.test>"\nto = ["oncall@example.test"]\n'
        f'subject = "[kiln] dead letters"\n'
        f'[smtp]\nhost = "127.0.0.1"\nport = {smtp_port}\nsecurity = "plain"\ntimeout_ms = 10000\n'
        f'{extra_smtp}'
        f'[kafka]\n"heartbeat.interval.ms" = "500"\n')
    return path


class Service:
    """A `kiln deadletter` process with its log in a file."""

    def __init__(self, config: Path, log: Path):
        self.log = log
        with open(log, "ab") as f:
            f.write(b"\n===== start\n")
            f.flush()
            self.proc = subprocess.Popen([kiln_bin(), "deadletter", "--config", str(config)],
                                         stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                         env={**clean_env(), "RUST_LOG": "info"})

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.text():
            assert self.proc.poll() is None, f"kiln deadletter exited {self.proc.returncode}\n{self.text()}"
            assert time.monotonic() < deadline, f"no {needle!r} in the log\n{self.text()[-6000:]}"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def smtp_server():
    started = []

    def start(**kw):
        inbox = Inbox()
        port = free_port()
        c = aiosmtpd_controller.Controller(inbox, hostname="127.0.0.1", port=port, **kw)
        c.start()
        started.append(c)
        return inbox, port

    yield start
    for c in started:
        c.stop()


def dead_letter_two_nodes(broker, tmp_path: Path, db_url: str) -> None:
    """Real paths only: intake registers, a real agent fails two nodes ten times each."""
    create_topic(broker, "kiln.nodes", partitions=2)
    create_topic(broker, "kiln.nodes.dlq", partitions=1)
    rows = ["hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,"
            "firmware_gpu_vbios,firmware_nic"]
    for host, (rack, bmc, *_rest) in FAILING.items():
        rows.append(f"{host},{rack},{bmc},H100-SXM,8,1.10,2.3.1,96.00,28.39")
    rows.append(f"{PASSING[0]},{PASSING[1]},{PASSING[2]},H100-SXM,8,1.10,2.3.1,96.00,28.39")
    manifest = tmp_path / "fleet.csv"
    manifest.write_text("\n".join(rows) + "\n")
    steps = "".join(
        f"  - check: scripted\n    name: {check}\n    outcome: fail\n    hosts: [{host}]\n"
        f"    message: \"{message}\"\n"
        for host, (_rack, _bmc, check, message, _action) in FAILING.items())
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(f"playbook: always-fail\ntimeout_s: 30\nchecks:\n{steps}")
    kiln("intake", "register", str(manifest), "--bootstrap", broker.addr, "--database-url", db_url)

    agent_cfg = tmp_path / "agent.toml"
    agent_cfg.write_text(
        f'bootstrap = "{broker.addr}"\ndatabase_url = "{db_url}"\nagent_id = "agent-dl"\n'
        f'playbook = "{playbook}"\nretry_backoff_ms = 10\nretry_backoff_max_ms = 20\n'
        f'session_timeout_ms = 6000\n[kafka]\n"heartbeat.interval.ms" = "500"\n')
    log = tmp_path / "agent.log"
    with open(log, "wb") as f:
        agent = subprocess.Popen([kiln_bin(), "agent", "--config", str(agent_cfg)],
                                 stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=clean_env())
    try:
        deadline = time.monotonic() + 120
        want = {**{h: "dead_lettered" for h in FAILING}, PASSING[0]: "passed"}
        while True:
            states = {}
            for host in want:
                cp = kiln("nodes", "show", host, "--json", "--database-url", db_url, check=False)
                states[host] = json.loads(cp.stdout)["node"]["state"] if cp.returncode == 0 else None
            if states == want:
                break
            assert agent.poll() is None, f"agent exited\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"states {states}\n{log.read_text()[-4000:]}"
            time.sleep(0.3)
        # The dead letters are on the topic once the agent committed past their runs.
        deadline = time.monotonic() + 30
        while dlq_high(broker) < 2:
            assert time.monotonic() < deadline, "dead letters not on kiln.nodes.dlq"
            time.sleep(0.2)
    finally:
        agent.terminate()
        agent.wait(timeout=15)
    # Kiln's own producers are idempotent (kiln_queue::producer_client_config): every batch
    # intake wrote (first attempts) and the agent wrote (retries, dead letters) carries a
    # producer id, with sequences contiguous per producer and partition.
    nodes = idempotent_producers(broker, "kiln.nodes", 2)
    dlq = idempotent_producers(broker, "kiln.nodes.dlq", 1)
    assert len(nodes) == 2, f"kiln.nodes: expected intake's and the agent's producer, got {nodes}"
    assert len(dlq) == 1 and dlq <= nodes, f"kiln.nodes.dlq written by {dlq}, kiln.nodes by {nodes}"


def idempotent_producers(broker, topic: str, partitions: int) -> set[int]:
    """The producer ids on the topic's batches (raw Fetch); fails on a batch without one."""
    pids: set[int] = set()
    for part in range(partitions):
        with kafka_raw.Conn(broker.addr) as c:
            err, hw, data = kafka_raw.fetch_v4(c, topic, part, 0, max_bytes=16 * 1024 * 1024)
        assert err == 0, f"Fetch {topic}/{part}: error {err}"
        batches = kafka_raw.parse_batches(data)
        assert sum(b.record_count for b in batches) == hw, (topic, part, hw, batches)
        next_seq: dict[int, int] = {}
        for b in batches:
            assert b.producer_id >= 0, f"{topic}/{part}: batch without a producer id: {b}"
            assert b.base_sequence == next_seq.get(b.producer_id, 0), f"{topic}/{part}: {b}"
            next_seq[b.producer_id] = b.base_sequence + b.record_count
            pids.add(b.producer_id)
    return pids


def dlq_high(broker) -> int:
    from confluent_kafka import TopicPartition
    c = rdk_consumer(broker)
    try:
        return c.get_watermark_offsets(TopicPartition("kiln.nodes.dlq", 0), timeout=10,
                                       cached=False)[1]
    finally:
        c.close()


def committed_deadletter(broker) -> int:
    from confluent_kafka import TopicPartition
    c = rdk_consumer(broker, **{"group.id": "deadletter"})
    try:
        return c.committed([TopicPartition("kiln.nodes.dlq", 0)], timeout=10)[0].offset
    finally:
        c.close()


def parts(raw: bytes):
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert msg.get_content_type() == "multipart/alternative", msg.get_content_type()
    kinds = [p.get_content_type() for p in msg.iter_parts()]
    assert kinds == ["text/plain", "text/html"], kinds
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    return msg, text, html


def test_daily_report_email_once_per_day(broker, tmp_path, smtp_server):
    db_url = f"sqlite://{tmp_path / 'kiln.db'}"
    dead_letter_two_nodes(broker, tmp_path, db_url)
    assert dlq_high(broker) == 2

    inbox, port = smtp_server()
    config = write_config(tmp_path / "deadletter.toml", broker, db_url, port)
    log = tmp_path / "deadletter.log"
    svc = Service(config, log)
    try:
        inbox.wait(1, 90, svc.text)
        svc.wait_log("report sent", 10)
        # The triage records were stored before their offsets were committed.
        deadline = time.monotonic() + 15
        while committed_deadletter(broker) != 2:
            assert time.monotonic() < deadline, "group deadletter did not commit past both"
            time.sleep(0.2)
        time.sleep(2)
        assert inbox.count() == 1, "a second email from the same service"
    finally:
        svc.stop()

    msg, text, html = parts(inbox.messages[0])
    assert msg["Subject"].startswith("[kiln] dead letters ")
    assert msg["Subject"].endswith(": 2 new, 0 still open")
    assert msg["To"] == "oncall@example.test"
    for host, (rack, bmc, check, message, action) in FAILING.items():
        for part in (text, html):
            for needle in (host, rack, bmc, check, action, message):
                assert needle in part, f"{needle!r} not in the report:\n{part}"
        assert f"  {action}: " in text, text
    # Ten attempts, all measured failures (none could not run), per node.
    assert text.count("10 attempts: 10 failed, 0 could not run") == 2, text
    assert "attempts: 1 fail (check_failed) | 2 fail (check_failed)" in text, text
    assert "== Rack rack-east ==" in text and "== Rack rack-west ==" in text
    assert text.index("rack-east") < text.index("gpu-e-01") < text.index("rack-west")
    assert PASSING[0] not in text, "a node that passed is not in the report"
    assert "<table" in html and "Rack rack-west</h2>" in html

    # Same day: --send-now does not send again, nor does a restarted service.
    cp = kiln("deadletter", "report", "--send-now", "--config", str(config))
    assert "not sent: the report of" in cp.stdout and "already sent" in cp.stdout, cp.stdout
    svc = Service(config, log)
    try:
        svc.wait_log("report already sent (or claimed) today", 60)
        svc.wait_log("next report", 10)
        time.sleep(1)
    finally:
        svc.stop()
    assert inbox.count() == 1, "a second email the same day"

    # The dry run shows the current report (text and HTML) and sends nothing.
    cp = kiln("deadletter", "report", "--dry-run", "--config", str(config))
    assert "gpu-e-01" in cp.stdout and "reseat cable/transceiver" in cp.stdout
    cp = kiln("deadletter", "report", "--dry-run", "--html", "--config", str(config))
    assert cp.stdout.startswith("<!DOCTYPE html>") and "gpu-w-01" in cp.stdout
    assert inbox.count() == 1


def make_cert(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, made with openssl."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=kiln test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
        "-subj", "/CN=127.0.0.1")
    (tmp_path / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf")
    return tmp_path / "ca.pem", tmp_path / "srv.pem", tmp_path / "srv.key"


def test_send_now_over_starttls_with_auth(tmp_path, smtp_server, broker):
    from aiosmtpd.smtp import AuthResult

    ca, cert, key = make_cert(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    logins = []

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = auth_data.login == b"kiln" and auth_data.password == b"s3cret"
        logins.append((mechanism, auth_data.login, ok))
        return AuthResult(success=ok)

    inbox, port = smtp_server(tls_context=ctx, require_starttls=True, authenticator=authenticator,
                              auth_required=True)
    db_url = f"sqlite://{tmp_path / 'kiln.db'}"
    pw = tmp_path / "smtp-password"
    pw.write_text("s3cret\n")
    config = write_config(tmp_path / "dl.toml", broker, db_url, port,
                          f'username = "kiln"\npassword_file = "{pw}"\nca_file = "{ca}"\n')
    text = config.read_text().replace('security = "plain"', 'security = "starttls"')
    config.write_text(text)
    cp = kiln("deadletter", "report", "--send-now", "--config", str(config))
    assert "sent the report of" in cp.stdout, cp.stdout
    assert inbox.count() == 1
    assert logins and logins[-1][1:] == (b"kiln", True), logins
    _msg, body, _html = parts(inbox.messages[0])
    assert "No node is dead-lettered." in body

    # A wrong password: no email, a clear error, and the day stays free. (aiosmtpd stalls
    # after a failed AUTH, so this also shows the exchange is bounded by smtp.timeout_ms.)
    pw.write_text("wrong\n")
    other = tmp_path / "kiln2.db"
    config.write_text(text.replace(str(tmp_path / "kiln.db"), str(other))
                      .replace("timeout_ms = 10000", "timeout_ms = 3000"))
    cp = kiln("deadletter", "report", "--send-now", "--config", str(config), check=False)
    assert cp.returncode != 0 and "SMTP" in cp.stderr, cp.stderr
    assert inbox.count() == 1


# The simulated fleet's faults (crates/kiln-sim) and what the report must say about each: the
# node's action line (component named as a person finds it) and an evidence line.
SIM_FAULTS = {
    "sim-0001": ("row-remap", 1,
                 r"RMA candidate: GPU \d, serial \d+, SXM slot \d: row remap failure; "
                 r"run NVIDIA field diagnostic, attach nvidia-bug-report.log.gz",
                 "rows remapped: "),
    "sim-0002": ("xid79", 2,
                 r"reboot the node: GPU \d, serial \d+, SXM slot \d: Xid 79; "
                 r"reboot the node and burn in again",
                 "NVRM: Xid (PCI:"),
    "sim-0003": ("ib-flap", 2,
                 r"reseat cable/transceiver: HCA mlx5_3 \(ib3\)[^:]*: ib netdev down; "
                 r"reseat the cable and transceiver",
                 "operstate"),
}


def test_report_of_simulated_faults_names_part_action_and_evidence(broker, tmp_path, smtp_server):
    """The sim's row-remap, Xid 79 and IB faults through real agents and the real service:
    each node's action, component and evidence in both parts of the delivered email, and the
    row-remap failure there after one attempt."""
    import re

    create_topic(broker, "kiln.nodes", partitions=2)
    create_topic(broker, "kiln.nodes.dlq", partitions=1)
    sim_dir = tmp_path / "sim"
    faults = [a for host, (kind, *_r) in SIM_FAULTS.items() for a in ("--fault", f"{host}={kind}")]
    sim_log = tmp_path / "sim.log"
    with open(sim_log, "wb") as f:
        sim = subprocess.Popen([kiln_bin(), "sim", "--racks", "1", "--nodes-per-rack", "3",
                                "--hostname-prefix", "sim", "--out", str(sim_dir), *faults],
                               stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=clean_env())
    db_url = f"sqlite://{tmp_path / 'kiln.db'}"
    agent = None
    try:
        deadline = time.monotonic() + 60
        while "serving until Ctrl-C" not in sim_log.read_text(errors="replace"):
            assert sim.poll() is None, sim_log.read_text()
            assert time.monotonic() < deadline, sim_log.read_text()
            time.sleep(0.1)
        kiln("intake", "register", str(sim_dir / "manifest.csv"), "--bootstrap", broker.addr,
             "--database-url", db_url)
        env = {**clean_env(), "KILN_AGENT__BOOTSTRAP": broker.addr,
               "KILN_AGENT__DATABASE_URL": db_url, "KILN_AGENT__RETRY_BACKOFF_MS": "50",
               "KILN_AGENT__RETRY_BACKOFF_MAX_MS": "200"}
        agent_log = tmp_path / "agent.log"
        with open(agent_log, "wb") as f:
            agent = subprocess.Popen([kiln_bin(), "agent", "--config", str(sim_dir / "agent.toml")],
                                     stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env)
        deadline = time.monotonic() + 180
        while dlq_high(broker) < len(SIM_FAULTS):
            assert agent.poll() is None, agent_log.read_text()[-4000:]
            assert time.monotonic() < deadline, agent_log.read_text()[-4000:]
            time.sleep(0.3)
        for host, (kind, attempts, *_r) in SIM_FAULTS.items():
            shown = json.loads(kiln("nodes", "show", host, "--json", "--database-url", db_url).stdout)
            assert shown["node"]["state"] == "dead_lettered", (host, shown["node"])
            assert len(shown["runs"]) == attempts, (host, kind, len(shown["runs"]))
            print(f"{kind}: dead-lettered after {len(shown['runs'])} attempt(s)")
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=15)

    try:
        inbox, port = smtp_server()
        config = write_config(tmp_path / "deadletter.toml", broker, db_url, port)
        config.write_text(config.read_text().replace(
            "[report]\n", '[report]\ndashboard_url = "https://kiln.example.test"\n'))
        svc = Service(config, tmp_path / "deadletter.log")
        try:
            inbox.wait(1, 90, svc.text)
        finally:
            svc.stop()
    finally:
        sim.send_signal(2)
        sim.wait(timeout=15)

    msg, text, html = parts(inbox.messages[0])
    assert msg["Subject"].endswith(": 3 new, 0 still open"), msg["Subject"]
    for host, (kind, attempts, action, evidence) in SIM_FAULTS.items():
        for name, part in (("text", text), ("html", html)):
            assert host in part, (name, host)
            assert re.search(action, part), f"{kind}: {action!r} not in the {name} part:\n{part}"
            assert evidence in part, f"{kind}: evidence {evidence!r} not in the {name} part"
            assert f"https://kiln.example.test/nodes/{host}" in part, (name, host)
        plural = "" if attempts == 1 else "s"
        assert f"{attempts} attempt{plural}: {attempts} failed, 0 could not run" in text, kind
