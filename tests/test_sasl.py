"""SASL on the Kafka listener, with real clients (docs/security.md).

One broker with `[tls]` (a server certificate from `kiln certs`, no client certificates) and
`[sasl]` offering SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN: SASL_SSL. Its first user comes from
`bootstrap_user` and `bootstrap_password_file`; the others are created through
AlterUserScramCredentials.

- librdkafka (confluent-kafka), kafka-python and kafkajs produce with SCRAM-SHA-512 on their
  default producers (idempotent), librdkafka also with SCRAM-SHA-256 and PLAIN, and a SASL
  consumer reads every record back.
- A wrong password and an unknown user get SASL_AUTHENTICATION_FAILED (the same message for
  both), logged with the client's address and never with the password; a request sent before
  authenticating closes the connection unanswered.
- confluent-kafka's AdminClient creates a user (the broker stores salted keys only), describes
  it, the new user logs in with kafka-python, and after the user is deleted it cannot.
- `kiln users` creates, lists and deletes users; a user who is not a super user may not manage
  users (CLUSTER_AUTHORIZATION_FAILED); `kiln topics` and `kiln groups` log in with each
  mechanism.
"""
from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from kiln_testlib import Broker, broker_pki, free_port, kiln, rdk_producer, rdk_sasl, read_values, wait_for_login

JS = Path(__file__).resolve().parent / "js"
ADMIN_PASSWORD = "bootstrap-secret-7f3a"
FAILED_DELAY_MS = 200


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return broker_pki(tmp_path_factory.mktemp("sasl-pki"))


def sasl_broker(make_broker, tmp_path: Path, pki: Path) -> Broker:
    port = free_port()
    secret = tmp_path / "admin.password"
    secret.write_text(ADMIN_PASSWORD + "\n")
    config = tmp_path / "sasl-broker.toml"
    config.write_text(
        f'node_id = 0\nlisten = "127.0.0.1:{port}"\ndata_dir = "{tmp_path / "sasl-data"}"\n'
        f'metrics_listen = "off"\n\n[tls]\n'
        f'cert_file = "{pki}/certs/node-0.crt"\nkey_file = "{pki}/certs/node-0.key"\n\n'
        f'[sasl]\nmechanisms = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]\n'
        f'failed_authentication_delay_ms = {FAILED_DELAY_MS}\n'
        f'bootstrap_user = "admin"\nbootstrap_password_file = "{secret}"\n')
    broker = make_broker(port=port, config_path=config)
    wait_for_login(broker, pki, "admin", ADMIN_PASSWORD)
    return broker


def auth_errors(broker: Broker, pki: Path, user: str, password: str,
                mechanism: str = "SCRAM-SHA-512") -> list:
    """librdkafka with these credentials: the errors its error callback reported while it
    tried to produce one record (which must not be delivered)."""
    from confluent_kafka import KafkaError
    errors: list = []
    delivered: list = []
    p = rdk_producer(broker, **rdk_sasl(pki, user, password, mechanism),
                     error_cb=errors.append, **{"message.timeout.ms": 3000})
    p.produce("sasl.nodes", value=b"must-not-land",
              on_delivery=lambda e, m: delivered.append(e))
    # Each failure of this address doubles the broker's wait (up to 32 x FAILED_DELAY_MS).
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
            e.code() == KafkaError._AUTHENTICATION for e in errors):
        p.poll(0.2)
    p.flush(5)
    assert all(e is not None for e in delivered), "a record was delivered without authentication"
    return errors


def test_three_clients_produce_and_consume_over_sasl_ssl(make_broker, tmp_path, pki):
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaProducer

    broker = sasl_broker(make_broker, tmp_path, pki)
    admin = AdminClient({"bootstrap.servers": broker.addr, **rdk_sasl(pki, "admin", ADMIN_PASSWORD)})
    admin.create_topics([NewTopic("sasl.nodes", 3, 1)])["sasl.nodes"].result(timeout=20)

    # librdkafka's default (idempotent) producer with each mechanism.
    for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
        errors: list = []
        p = rdk_producer(broker, **rdk_sasl(pki, "admin", ADMIN_PASSWORD, mechanism))
        for i in range(20):
            p.produce("sasl.nodes", key=f"k{i % 4}".encode(), value=f"rdk-{mechanism}-{i}".encode(),
                      on_delivery=lambda e, m: e and errors.append(e))
        assert p.flush(30) == 0 and not errors, (mechanism, errors)

    # kafka-python, its default producer (idempotent) over SASL_SSL with SCRAM-SHA-512.
    kp = KafkaProducer(bootstrap_servers=broker.addr, security_protocol="SASL_SSL",
                       ssl_cafile=str(pki / "ca" / "ca.crt"), sasl_mechanism="SCRAM-SHA-512",
                       sasl_plain_username="admin", sasl_plain_password=ADMIN_PASSWORD)
    for i in range(30):
        kp.send("sasl.nodes", key=f"k{i % 4}".encode(), value=f"kp-{i}".encode()).get(timeout=20)
    kp.close()

    # kafkajs, idempotent, SCRAM-SHA-512 over TLS: 4 keys x 5 records.
    env = {**os.environ,
           "KILN_TEST_TLS": json.dumps({"ca": str(pki / "ca" / "ca.crt")}),
           "KILN_TEST_SASL": json.dumps({"mechanism": "scram-sha-512", "username": "admin",
                                         "password": ADMIN_PASSWORD})}
    cp = subprocess.run(["node", str(JS / "produce.js"), broker.addr, "sasl.nodes", "idempotent",
                         "4", "5"], capture_output=True, text=True, timeout=75, env=env,
                        stdin=subprocess.DEVNULL)
    out = json.loads(cp.stdout.strip().splitlines()[-1])
    assert cp.returncode == 0 and "error" not in out, (out, cp.stderr[-4000:])
    assert not out["problems"], out["problems"]

    values = read_values(broker, "sasl.nodes", 3, 110, **rdk_sasl(pki, "admin", ADMIN_PASSWORD))
    for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
        assert sorted(v for v in values if v.startswith(f"rdk-{mechanism}-")) == \
            sorted(f"rdk-{mechanism}-{i}" for i in range(20)), mechanism
    assert sorted(v for v in values if v.startswith("kp-")) == sorted(f"kp-{i}" for i in range(30))
    assert sorted(v for v in values if v.startswith("key-")) == \
        sorted(f"key-{k}:{s}" for k in range(4) for s in range(5))
    assert len(values) == 110
    # No secret reaches the log.
    assert ADMIN_PASSWORD not in broker.log_text()


def metadata_v1_frame() -> bytes:
    body = (3).to_bytes(2, "big") + (1).to_bytes(2, "big") + (7).to_bytes(4, "big") \
        + (1).to_bytes(2, "big") + b"t" + (-1).to_bytes(4, "big", signed=True)
    return len(body).to_bytes(4, "big") + body


def test_wrong_passwords_and_unauthenticated_requests_are_refused(make_broker, tmp_path, pki):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = sasl_broker(make_broker, tmp_path, pki)
    admin = AdminClient({"bootstrap.servers": broker.addr, **rdk_sasl(pki, "admin", ADMIN_PASSWORD)})
    admin.create_topics([NewTopic("sasl.nodes", 1, 1)])["sasl.nodes"].result(timeout=20)

    wrong = "not-the-password-91c2"
    messages = {}
    for label, user, password, mechanism in [
            ("wrong password", "admin", wrong, "SCRAM-SHA-512"),
            ("unknown user", "mallory", wrong, "SCRAM-SHA-512"),
            ("wrong password, PLAIN", "admin", wrong, "PLAIN")]:
        errors = auth_errors(broker, pki, user, password, mechanism)
        failed = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
        assert failed, (label, errors)
        text = failed[0].str()
        assert "Authentication failed" in text and "invalid credentials" in text, (label, text)
        # The broker's message, without librdkafka's address and timing around it.
        messages[label] = re.search(r"Authentication failed: [^(]*", text).group(0)
    # An unknown user and a wrong password read the same.
    assert messages["wrong password"] == messages["unknown user"], messages

    # A request before authenticating: the connection closes, nothing is answered.
    ctx = ssl.create_default_context(cafile=str(pki / "ca" / "ca.crt"))
    with socket.create_connection((broker.host, broker.port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=broker.host) as s:
            s.sendall(metadata_v1_frame())
            try:
                got = s.recv(4096)
            except (ssl.SSLError, OSError):
                got = b""
    assert got == b"", got

    deadline = time.monotonic() + 10
    while True:
        log = broker.log_text()
        refusals = [l for l in log.splitlines() if "refused a client: SASL authentication failed" in l]
        early = [l for l in log.splitlines() if "a request before SASL authentication" in l]
        if (len(refusals) >= 3 and early) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(refusals) >= 3 and early, log[-4000:]
    assert all("peer=127.0.0.1:" in l for l in refusals + early), refusals + early
    assert wrong not in log and ADMIN_PASSWORD not in log
    # The broker still serves authenticated clients.
    assert read_values(broker, "sasl.nodes", 1, 0, timeout_s=1, **rdk_sasl(pki, "admin", ADMIN_PASSWORD)) == []


def test_users_are_created_described_and_deleted_through_the_admin_api(make_broker, tmp_path, pki):
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialDeletion,
                                       UserScramCredentialUpsertion)
    from kafka import KafkaProducer

    broker = sasl_broker(make_broker, tmp_path, pki)
    admin = AdminClient({"bootstrap.servers": broker.addr, **rdk_sasl(pki, "admin", ADMIN_PASSWORD)})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("agent-7", info, b"agent-seven-pw", b"some-salt-bytes")])
    futures["agent-7"].result(timeout=20)

    described = admin.describe_user_scram_credentials(["admin", "agent-7"])
    described = {u: f.result(timeout=20) for u, f in described.items()}
    mechs = {u: sorted((c.mechanism, c.iterations) for c in d.scram_credential_infos)
             for u, d in described.items()}
    assert mechs["agent-7"] == [(ScramMechanism.SCRAM_SHA_512, 8192)], mechs
    assert sorted(m for m, _ in mechs["admin"]) == sorted(
        [ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512]), mechs

    # Too few iterations is Kafka's UNACCEPTABLE_CREDENTIAL, and nothing changes.
    weak = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "weak", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"pw")])
    with pytest.raises(Exception) as refused:
        weak["weak"].result(timeout=20)
    assert "UNACCEPTABLE_CREDENTIAL" in str(refused.value) or "4096" in str(refused.value), \
        refused.value

    # The new user logs in with another client.
    def kp_login(password: str):
        return KafkaProducer(bootstrap_servers=broker.addr, security_protocol="SASL_SSL",
                             ssl_cafile=str(pki / "ca" / "ca.crt"),
                             sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="agent-7",
                             sasl_plain_password=password, request_timeout_ms=5000,
                             max_block_ms=5000)
    # kafka-python authenticates while it bootstraps (its constructor probes the broker).
    kp_login("agent-seven-pw").close()

    # Deleted, it cannot.
    admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion("agent-7", ScramMechanism.SCRAM_SHA_512)]
    )["agent-7"].result(timeout=20)
    from confluent_kafka import KafkaError
    errors = auth_errors(broker, pki, "agent-7", "agent-seven-pw")
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    # Deleting again names what is missing.
    again = admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion("agent-7", ScramMechanism.SCRAM_SHA_512)])
    with pytest.raises(Exception) as missing:
        again["agent-7"].result(timeout=20)
    assert "RESOURCE_NOT_FOUND" in str(missing.value) or "no SCRAM-SHA-512" in str(missing.value), \
        missing.value
    assert b"agent-seven-pw".decode() not in broker.log_text()


def test_kiln_users_and_topics_over_sasl_ssl(make_broker, tmp_path, pki):
    broker = sasl_broker(make_broker, tmp_path, pki)
    admin_pw = tmp_path / "admin.pw"
    admin_pw.write_text(ADMIN_PASSWORD + "\n")
    new_pw = tmp_path / "agent-9.pw"
    new_pw.write_text("agent-nine-secret\n")
    base = ["--bootstrap", broker.addr, "--tls-ca", str(pki / "ca" / "ca.crt")]
    as_admin = [*base, "--sasl-user", "admin", "--sasl-password-file", str(admin_pw)]

    kiln("users", "create", "agent-9", "--password-file", str(new_pw), *as_admin)
    listed = kiln("users", "list", *as_admin).stdout
    line = next(l for l in listed.splitlines() if l.startswith("agent-9 "))
    assert "SCRAM-SHA-512" in line and "SCRAM-SHA-256" in line, listed

    # The new user drives the topic commands, with either mechanism.
    as_agent = [*base, "--sasl-user", "agent-9", "--sasl-password-file", str(new_pw)]
    kiln("topics", "create", "sasl.cli", "--partitions", "2", *as_agent)
    assert "sasl.cli" in kiln("topics", "list", *as_agent, "--sasl-mechanism", "SCRAM-SHA-256").stdout
    kiln("groups", "list", *as_agent, "--sasl-mechanism", "PLAIN")

    # agent-9 is no super user: it may not list, make or change users (nor admin's password).
    for cmd in (["users", "list"], ["users", "create", "admin", "--password-file", str(new_pw)]):
        cp = kiln(*cmd, *as_agent, check=False)
        assert cp.returncode != 0 and "only a super user may manage SCRAM users" in cp.stderr, \
            (cmd, cp.stderr)
    kiln("topics", "list", *as_admin)  # admin's password is unchanged

    # A wrong password: the command fails and says why.
    wrong = tmp_path / "wrong.pw"
    wrong.write_text("nope\n")
    cp = kiln("topics", "list", *base, "--sasl-user", "agent-9", "--sasl-password-file", str(wrong),
              check=False)
    assert cp.returncode != 0 and "Authentication failed" in cp.stderr, cp.stderr
    # No login at all: the broker closes the connection before serving anything.
    cp = kiln("topics", "list", *base, check=False)
    assert cp.returncode != 0, cp.stdout

    kiln("users", "delete", "agent-9", *as_admin)
    assert "agent-9" not in kiln("users", "list", *as_admin).stdout
    cp = kiln("users", "delete", "agent-9", *as_admin, check=False)
    assert cp.returncode != 0 and "no SCRAM credentials" in cp.stderr, cp.stderr
    # Secrets never reach the broker's log or the CLI's output.
    for secret in ("agent-nine-secret", ADMIN_PASSWORD):
        assert secret not in broker.log_text()
        assert secret not in listed
