"""TLS on the Kafka listener and mutual TLS between brokers, with real clients.

Certificates come from `kiln certs` (a throwaway CA per module): a broker certificate for
127.0.0.1 and localhost, client certificates (one valid, one expired), and a second CA that
nobody trusts.

- One broker with `[tls]` and a client CA (client certificates required): librdkafka
  (confluent-kafka), kafka-python and kafkajs each produce over TLS with a client
  certificate, and everything is read back over TLS.
- The same broker refuses, each in its TLS handshake and each logged with the client's
  address: no client certificate, an expired one, one signed by another CA, and a plaintext
  client; a certified client still works afterwards.
- SIGHUP reloads the listener's certificate: new connections get the new one, a producer
  connected before the reload keeps delivering, and a broken key file on reload leaves the
  old settings serving (the error is logged).
- Three brokers with `[cluster.tls]`: an RF 3 topic takes acks=all writes; the Raft port
  refuses plain TCP, a certified node that is not a member, a client certificate naming no
  broker, and a broker certificate from another CA, each logged with the peer's address;
  the cluster keeps replicating and fails over (kill -9 of a leader) with nothing lost.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from kiln_cluster import Cluster, cluster_fixture
from kiln_testlib import Broker, free_port, kiln, rdk_producer, read_partition, read_values

JS = Path(__file__).resolve().parent / "js"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, broker certificates for nodes 0-3 and 9, client certificates, and a rogue CA."""
    root = tmp_path_factory.mktemp("pki")
    kiln("certs", "ca", "--dir", str(root / "ca"))
    for node in (0, 1, 2, 3, 9):
        kiln("certs", "broker", "--ca-dir", str(root / "ca"), "--node", str(node),
             "--host", "127.0.0.1", "--host", "localhost", "--out", str(root / "certs"))
    kiln("certs", "client", "--ca-dir", str(root / "ca"), "--name", "agent-1",
         "--out", str(root / "certs"))
    kiln("certs", "client", "--ca-dir", str(root / "ca"), "--name", "old", "--expired",
         "--out", str(root / "certs"))
    kiln("certs", "ca", "--dir", str(root / "rogue-ca"), "--name", "rogue CA")
    kiln("certs", "client", "--ca-dir", str(root / "rogue-ca"), "--name", "agent-1",
         "--out", str(root / "rogue"))
    kiln("certs", "broker", "--ca-dir", str(root / "rogue-ca"), "--node", "2",
         "--out", str(root / "rogue"))
    # A CA refuses to be overwritten.
    cp = kiln("certs", "ca", "--dir", str(root / "ca"), check=False)
    assert cp.returncode != 0 and "not overwriting" in cp.stderr, cp.stderr
    return root


def tls_broker(make_broker, tmp_path: Path, pki: Path) -> Broker:
    port = free_port()
    data = tmp_path / "tls-data"
    config = tmp_path / "tls-broker.toml"
    config.write_text(
        f'node_id = 0\nlisten = "127.0.0.1:{port}"\ndata_dir = "{data}"\n'
        f'metrics_listen = "off"\n\n[tls]\n'
        f'cert_file = "{pki}/certs/node-0.crt"\nkey_file = "{pki}/certs/node-0.key"\n'
        f'client_ca_file = "{pki}/ca/ca.crt"\n')
    return make_broker(port=port, config_path=config)


def rdk_tls(pki: Path, client: str = "agent-1", certs: str = "certs") -> dict:
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki / "ca" / "ca.crt"),
        "ssl.certificate.location": str(pki / certs / f"{client}.crt"),
        "ssl.key.location": str(pki / certs / f"{client}.key"),
    }


def create_topic_tls(broker: Broker, pki: Path, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.addr, **rdk_tls(pki)})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=20)


def handshake(broker_host: str, port: int, ca: Path | None, cert: Path | None = None,
              key: Path | None = None) -> str:
    """A raw TLS connection that sends an ApiVersions v0 request and reads the answer:
    "served" if an answer came, else the error that ended it."""
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else ssl.create_default_context()
    if cert:
        ctx.load_cert_chain(str(cert), str(key))
    try:
        with socket.create_connection((broker_host, port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=broker_host) as s:
                # ApiVersions v0: length, api key 18, version 0, correlation id 1, client id "t".
                body = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + (1).to_bytes(4, "big") \
                    + (1).to_bytes(2, "big") + b"t"
                s.sendall(len(body).to_bytes(4, "big") + body)
                answer = s.recv(4)
                return "served" if len(answer) == 4 else "closed"
    except (ssl.SSLError, OSError) as e:
        return f"refused: {e}"


def test_three_clients_produce_and_consume_over_mutual_tls(make_broker, tmp_path, pki):
    from kafka import KafkaProducer

    broker = tls_broker(make_broker, tmp_path, pki)
    create_topic_tls(broker, pki, "tls.nodes", 3)

    # librdkafka, its default producer plus TLS.
    p = rdk_producer(broker, **rdk_tls(pki))
    errors: list = []
    for i in range(50):
        p.produce("tls.nodes", key=f"k{i % 5}".encode(), value=f"rdk-{i}".encode(),
                  on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(30) == 0 and not errors, errors

    # kafka-python, its default producer (idempotent) plus TLS.
    kp = KafkaProducer(bootstrap_servers=broker.addr, security_protocol="SSL",
                       ssl_cafile=str(pki / "ca" / "ca.crt"),
                       ssl_certfile=str(pki / "certs" / "agent-1.crt"),
                       ssl_keyfile=str(pki / "certs" / "agent-1.key"))
    for i in range(50):
        kp.send("tls.nodes", key=f"k{i % 5}".encode(), value=f"kp-{i}".encode()).get(timeout=20)
    kp.close()

    # kafkajs over TLS: produce.js writes 4 keys x 5 records, idempotent.
    env = {**os.environ, "KILN_TEST_TLS": json.dumps({
        "ca": str(pki / "ca" / "ca.crt"), "cert": str(pki / "certs" / "agent-1.crt"),
        "key": str(pki / "certs" / "agent-1.key")})}
    cp = subprocess.run(["node", str(JS / "produce.js"), broker.addr, "tls.nodes", "idempotent",
                         "4", "5"], capture_output=True, text=True, timeout=75, env=env,
                        stdin=subprocess.DEVNULL)
    out = json.loads(cp.stdout.strip().splitlines()[-1])
    assert cp.returncode == 0 and "error" not in out, (out, cp.stderr[-4000:])
    assert not out["problems"], out["problems"]

    values = read_values(broker, "tls.nodes", 3, 120, **rdk_tls(pki))
    assert sorted(v for v in values if v.startswith("rdk-")) == sorted(f"rdk-{i}" for i in range(50))
    assert sorted(v for v in values if v.startswith("kp-")) == sorted(f"kp-{i}" for i in range(50))
    assert sorted(v for v in values if v.startswith("key-")) == \
        sorted(f"key-{k}:{s}" for k in range(4) for s in range(5))
    assert len(values) == 120


def test_the_listener_refuses_clients_without_a_valid_certificate(make_broker, tmp_path, pki):
    broker = tls_broker(make_broker, tmp_path, pki)
    host, port = broker.host, broker.port
    ca = pki / "ca" / "ca.crt"
    cases = {
        "no certificate": handshake(host, port, ca),
        "expired certificate": handshake(host, port, ca, pki / "certs" / "old.crt",
                                         pki / "certs" / "old.key"),
        "another CA's certificate": handshake(host, port, ca, pki / "rogue" / "agent-1.crt",
                                              pki / "rogue" / "agent-1.key"),
    }
    for what, outcome in cases.items():
        assert outcome != "served", f"{what}: {outcome}"
    # Plaintext Kafka to the TLS port: never answered.
    with socket.create_connection((host, port), timeout=5) as s:
        body = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + (1).to_bytes(4, "big") \
            + (1).to_bytes(2, "big") + b"t"
        s.sendall(len(body).to_bytes(4, "big") + body)
        try:
            got = s.recv(4096)
        except OSError:
            got = b""
        # The TLS listener answers a plaintext hello with a TLS alert, never a Kafka frame.
        assert not got or got[0] == 0x15, got
    # The broker logs a refusal after the client has seen it: wait for the fourth line.
    deadline = time.monotonic() + 10
    while True:
        log = broker.log_text()
        refusals = [line for line in log.splitlines() if "refused a client: TLS handshake failed" in line]
        if len(refusals) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(refusals) >= 4, log[-4000:]
    assert all(f"peer={host}:" in line for line in refusals), refusals
    text = "\n".join(refusals)
    assert "peer sent no certificates" in text, text
    assert "Expired" in text or "expired" in text, text
    assert "UnknownIssuer" in text or "unknown issuer" in text.lower(), text
    # A certified client is still served.
    assert handshake(host, port, ca, pki / "certs" / "agent-1.crt",
                     pki / "certs" / "agent-1.key") == "served"
    broker.assert_alive()


def served_certificate(host: str, port: int, pki: Path) -> bytes:
    ctx = ssl.create_default_context(cafile=str(pki / "ca" / "ca.crt"))
    ctx.load_cert_chain(str(pki / "certs" / "agent-1.crt"), str(pki / "certs" / "agent-1.key"))
    with socket.create_connection((host, port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            return s.getpeercert(binary_form=True)


def test_sighup_reloads_the_certificate_without_dropping_connections(make_broker, tmp_path, pki):
    # The broker's own copy of its files, so the test can rotate them.
    own = tmp_path / "own"
    own.mkdir()
    for ext in ("crt", "key"):
        (own / f"node-0.{ext}").write_bytes((pki / "certs" / f"node-0.{ext}").read_bytes())
    port = free_port()
    config = tmp_path / "reload.toml"
    config.write_text(
        f'node_id = 0\nlisten = "127.0.0.1:{port}"\ndata_dir = "{tmp_path / "reload-data"}"\n'
        f'metrics_listen = "off"\n\n[tls]\ncert_file = "{own}/node-0.crt"\n'
        f'key_file = "{own}/node-0.key"\nclient_ca_file = "{pki}/ca/ca.crt"\n')
    broker = make_broker(port=port, config_path=config)
    create_topic_tls(broker, pki, "tls.reload", 1)
    before = served_certificate(broker.host, port, pki)

    p = rdk_producer(broker, **rdk_tls(pki))
    errors: list = []
    for i in range(20):
        p.produce("tls.reload", value=f"before-{i}".encode(),
                  on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(30) == 0 and not errors, errors

    # Rotate: a new certificate for the same names, written over the broker's files.
    fresh = tmp_path / "fresh"
    kiln("certs", "broker", "--ca-dir", str(pki / "ca"), "--node", "0", "--host", "127.0.0.1",
         "--out", str(fresh))
    for ext in ("crt", "key"):
        (own / f"node-0.{ext}").write_bytes((fresh / f"node-0.{ext}").read_bytes())
    mark = len(broker.log_text())
    os.kill(broker.pid, signal.SIGHUP)
    broker.wait_log(r"reloaded the Kafka listener's TLS certificate", since=mark)
    after = served_certificate(broker.host, port, pki)
    assert after != before and after == ssl.PEM_cert_to_DER_cert((fresh / "node-0.crt").read_text())

    # The producer connected before the reload still delivers on its connection.
    for i in range(20):
        p.produce("tls.reload", value=f"after-{i}".encode(),
                  on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(30) == 0 and not errors, errors

    # A broken key on reload: the error names the file, the last good settings keep serving.
    (own / "node-0.key").write_text("not a key\n")
    mark = len(broker.log_text())
    os.kill(broker.pid, signal.SIGHUP)
    line = broker.wait_log(r"keeping the Kafka listener's old TLS settings.*", since=mark)
    assert "node-0.key" in line, line
    assert served_certificate(broker.host, port, pki) == after
    values = read_values(broker, "tls.reload", 1, 40, **rdk_tls(pki))
    assert values == [f"before-{i}" for i in range(20)] + [f"after-{i}" for i in range(20)]
    broker.assert_alive()


@pytest.fixture
def tls_cluster(request, tmp_path, pki):
    def extra(node_id: int) -> str:
        return (f'[cluster.tls]\nca_file = "{pki}/ca/ca.crt"\n'
                f'cert_file = "{pki}/certs/node-{node_id}.crt"\n'
                f'key_file = "{pki}/certs/node-{node_id}.key"\n')
    yield from cluster_fixture(request, tmp_path / "cluster", extra_config=extra)


def raft_attempt(port: int, pki: Path, cert: Path | None, key: Path | None, node: int) -> str:
    """Connects to a Raft port as a TLS client asking for kiln-node-<node>, sends a frame and
    reads: "answered" if any bytes came back, else how it ended."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(pki / "ca" / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(cert), str(key))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=f"kiln-node-{node}") as s:
                # A Hello (kind 8) from node 9: framing is checked only after the handshake.
                s.sendall(b"\x00\x00\x00\x13" + b"\x00" * 4 + b"\x08\x00\x00" + b"\x00" * 16)
                return "answered" if s.recv(64) else "closed"
    except (ssl.SSLError, OSError) as e:
        return f"refused: {e}"


def test_brokers_replicate_over_mutual_tls_and_refuse_strangers(tls_cluster: Cluster, pki):
    c = tls_cluster
    c.create_topic("tls.replicated", 3, 3)
    p = rdk_producer(c, **{"enable.idempotence": True})
    acked: list = []

    def cb(err, msg):
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value().decode()))

    for i in range(300):
        p.produce("tls.replicated", key=f"rack-{i % 6}".encode(), value=f"v{i}".encode(),
                  on_delivery=cb)
    assert p.flush(30) == 0 and len(acked) == 300

    port = c.raft_port[1]
    node1 = c.node(1)
    mark = len(node1.log_text())
    # Plain TCP: the TLS handshake fails.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"\x00\x00\x00\x13" + b"\x00" * 23)
        try:
            got = s.recv(64)
        except OSError:
            got = b""
        assert not got or got[0] == 0x15, got
    outcomes = {
        "a certified node that is not a member": raft_attempt(
            port, pki, pki / "certs" / "node-9.crt", pki / "certs" / "node-9.key", 1),
        "a client certificate naming no broker": raft_attempt(
            port, pki, pki / "certs" / "agent-1.crt", pki / "certs" / "agent-1.key", 1),
        "another CA's broker certificate": raft_attempt(
            port, pki, pki / "rogue" / "node-2.crt", pki / "rogue" / "node-2.key", 1),
        "no certificate": raft_attempt(port, pki, None, None, 1),
    }
    for what, outcome in outcomes.items():
        assert outcome != "answered", f"{what}: {outcome}"
    node1.wait_log(r"node 9 is not a member", since=mark)
    time.sleep(0.3)
    refusals = [line for line in node1.log_text()[mark:].splitlines()
                if "raft listener: refused a connection" in line]
    assert len(refusals) >= 5, refusals
    assert all("peer=127.0.0.1:" in line for line in refusals), refusals

    # The cluster keeps replicating, and fails over on its TLS links.
    for i in range(300, 400):
        p.produce("tls.replicated", key=f"rack-{i % 6}".encode(), value=f"v{i}".encode(),
                  on_delivery=cb)
    assert p.flush(30) == 0 and len(acked) == 400
    leader, _ = c.wait_leader("tls.replicated", 0)
    c.kill9(leader)
    for i in range(400, 500):
        p.produce("tls.replicated", key=f"rack-{i % 6}".encode(), value=f"v{i}".encode(),
                  on_delivery=cb)
    assert p.flush(60) == 0 and len(acked) == 500
    p = None
    got = {}
    for part in range(3):
        for r in read_partition(c, "tls.replicated", part):
            got[(part, r.offset)] = r.value.decode()
    for part, offset, value in acked:
        assert got.get((part, offset)) == value, (part, offset, value)


def test_kiln_admin_commands_over_mutual_tls(make_broker, tmp_path, pki):
    broker = tls_broker(make_broker, tmp_path, pki)
    tls = ["--tls-ca", str(pki / "ca" / "ca.crt"), "--tls-cert", str(pki / "certs" / "agent-1.crt"),
           "--tls-key", str(pki / "certs" / "agent-1.key")]
    kiln("topics", "create", "tls.admin", "--partitions", "2", "--bootstrap", broker.addr, *tls)
    listed = kiln("topics", "list", "--bootstrap", broker.addr, *tls).stdout
    assert "tls.admin" in listed, listed
    kiln("groups", "list", "--bootstrap", broker.addr, *tls)
    # Without the client certificate the listener refuses, and the command says TLS failed.
    cp = kiln("topics", "list", "--bootstrap", broker.addr, "--tls-ca", str(pki / "ca" / "ca.crt"),
              check=False)
    assert cp.returncode != 0, cp.stdout
    # A certificate without its key is a usage error.
    cp = kiln("topics", "list", "--bootstrap", broker.addr, "--tls-ca", str(pki / "ca" / "ca.crt"),
              "--tls-cert", str(pki / "certs" / "agent-1.crt"), check=False)
    assert cp.returncode != 0 and "--tls-key" in cp.stderr, cp.stderr
