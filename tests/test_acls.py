"""ACLs on the Kafka listener, with real clients (docs/security.md, "ACLs").

One broker with `[tls]`, `[sasl]` (SCRAM-SHA-512; `admin` is the bootstrap user and so a super
user) and `[authorization]` (nothing is allowed that no ACL allows). Users `agent` and
`intake` are made with `kiln users`.

- With no ACLs, `agent` sees no topics in Metadata and its produce is refused.
- The burn-in agents' role: READ on group `burnin` and on topic `acl.nodes`. Then `agent`
  consumes in group `burnin`, but a produce to `acl.nodes` (librdkafka's and kafka-python's
  default producers) fails with TOPIC_AUTHORIZATION_FAILED, and joining another group fails
  with GROUP_AUTHORIZATION_FAILED.
- The intake role: WRITE on the prefix `acl.` (created through confluent-kafka's
  AdminClient.create_acls); kafka-python's default (idempotent) producer writes, which needs
  WRITE on some topic (KIP-679).
- A DENY beats an ALLOW; `kiln acls list` and `delete` show and remove bindings, after which
  the agent is refused again; an agent may not create ACLs (CLUSTER_AUTHORIZATION_FAILED).
- A broker without `[authorization]` answers the ACL APIs SECURITY_DISABLED.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from kiln_testlib import Broker, free_port, kiln, rdk_consumer, rdk_producer, rdk_sasl, wait_for_login

ADMIN_PASSWORD = "acl-admin-secret-41c9"
PASSWORDS = {"agent": "agent-secret-77d1", "intake": "intake-secret-90be"}
TOPIC = "acl.nodes"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("acl-pki")
    kiln("certs", "ca", "--dir", str(root / "ca"))
    kiln("certs", "broker", "--ca-dir", str(root / "ca"), "--node", "0",
         "--host", "127.0.0.1", "--out", str(root / "certs"))
    return root


def acl_broker(make_broker, tmp_path: Path, pki: Path) -> Broker:
    port = free_port()
    secret = tmp_path / "admin.password"
    secret.write_text(ADMIN_PASSWORD + "\n")
    config = tmp_path / "acl-broker.toml"
    config.write_text(
        f'node_id = 0\nlisten = "127.0.0.1:{port}"\ndata_dir = "{tmp_path / "acl-data"}"\n'
        f'metrics_listen = "off"\n\n[tls]\n'
        f'cert_file = "{pki}/certs/node-0.crt"\nkey_file = "{pki}/certs/node-0.key"\n\n'
        f'[sasl]\nmechanisms = ["SCRAM-SHA-512"]\nfailed_authentication_delay_ms = 100\n'
        f'bootstrap_user = "admin"\nbootstrap_password_file = "{secret}"\n\n'
        f'[authorization]\n')
    broker = make_broker(port=port, config_path=config)
    wait_for_login(broker, pki, "admin", ADMIN_PASSWORD)
    return broker


def cli_as(broker: Broker, pki: Path, tmp_path: Path, user: str) -> list[str]:
    password = ADMIN_PASSWORD if user == "admin" else PASSWORDS[user]
    pw = tmp_path / f"{user}.pw"
    pw.write_text(password + "\n")
    return ["--bootstrap", broker.addr, "--tls-ca", str(pki / "ca" / "ca.crt"),
            "--sasl-user", user, "--sasl-password-file", str(pw)]


def sasl_as(pki: Path, user: str) -> dict:
    return rdk_sasl(pki, user, ADMIN_PASSWORD if user == "admin" else PASSWORDS[user])


def produce_error(broker: Broker, pki: Path, user: str) -> object:
    """librdkafka's default producer as `user`: the delivery error of one record (None when
    delivered)."""
    delivered: list = []
    p = rdk_producer(broker, **sasl_as(pki, user), **{"message.timeout.ms": 10000})
    p.produce(TOPIC, key=b"rack-1", value=f"from-{user}".encode(),
              on_delivery=lambda e, m: delivered.append(e))
    p.flush(20)
    assert len(delivered) == 1, "the delivery report never came"
    return delivered[0]


def kafka_python_producer(broker: Broker, pki: Path, user: str):
    from kafka import KafkaProducer
    return KafkaProducer(bootstrap_servers=broker.addr, security_protocol="SASL_SSL",
                         ssl_cafile=str(pki / "ca" / "ca.crt"), sasl_mechanism="SCRAM-SHA-512",
                         sasl_plain_username=user, sasl_plain_password=PASSWORDS[user])


def consume_in_group(broker: Broker, pki: Path, user: str, group: str, expected: int,
                     timeout_s: float = 30.0) -> tuple[list[str], list]:
    """Values read in `group` as `user` from the start, and the errors seen, until `expected`
    values or an error arrived."""
    c = rdk_consumer(broker, **sasl_as(pki, user), **{"group.id": group,
                                                    "auto.offset.reset": "earliest"})
    values, errors = [], []
    try:
        c.subscribe([TOPIC])
        deadline = time.monotonic() + timeout_s
        while len(values) < expected and not errors and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                errors.append(m.error())
                continue
            values.append(m.value().decode())
    finally:
        c.close()
    return values, errors


def test_roles_allow_what_they_name_and_refuse_the_rest(make_broker, tmp_path, pki):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation,
                                       AclPermissionType, AdminClient, NewTopic,
                                       ResourcePatternType, ResourceType)

    broker = acl_broker(make_broker, tmp_path, pki)
    as_admin = cli_as(broker, pki, tmp_path, "admin")
    for user in PASSWORDS:
        pw = tmp_path / f"new-{user}.pw"
        pw.write_text(PASSWORDS[user] + "\n")
        kiln("users", "create", user, "--password-file", str(pw), *as_admin)
    admin = AdminClient({"bootstrap.servers": broker.addr, **sasl_as(pki, "admin")})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(timeout=20)
    p = rdk_producer(broker, **sasl_as(pki, "admin"))
    for i in range(10):
        p.produce(TOPIC, key=f"rack-{i % 2}".encode(), value=f"node-{i}".encode())
    assert p.flush(20) == 0

    # No ACLs: agent sees no topics, and may not write.
    agent_admin = AdminClient({"bootstrap.servers": broker.addr, **sasl_as(pki, "agent")})
    assert TOPIC not in agent_admin.list_topics(timeout=10).topics
    err = produce_error(broker, pki, "agent")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    # The agents' role, made with kiln acls.
    as_agent = cli_as(broker, pki, tmp_path, "agent")
    kiln("acls", "create", "--principal", "User:agent", "--allow", "--operation", "read",
         "--group", "burnin", *as_admin)
    kiln("acls", "create", "--principal", "User:agent", "--allow", "--operation", "read",
         "--topic", TOPIC, *as_admin)
    assert TOPIC in agent_admin.list_topics(timeout=10).topics  # READ implies DESCRIBE
    values, errors = consume_in_group(broker, pki, "agent", "burnin", 10)
    assert not errors and sorted(values) == sorted(f"node-{i}" for i in range(10)), (values, errors)
    err = produce_error(broker, pki, "agent")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    # kafka-python's default producer is refused too (at InitProducerId or at produce).
    from kafka.errors import KafkaError as KPError
    kp = kafka_python_producer(broker, pki, "agent")
    with pytest.raises(KPError) as refused:
        kp.send(TOPIC, key=b"rack-1", value=b"kp-agent").get(timeout=20)
    assert "AuthorizationFailed" in str(refused.value), refused.value
    kp.close(timeout=5)
    values, errors = consume_in_group(broker, pki, "agent", "not-burnin", 1, timeout_s=15)
    assert values == [] and errors and errors[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, \
        (values, errors)
    # An agent may not grant itself more.
    cp = kiln("acls", "create", "--principal", "User:agent", "--allow", "--operation", "write",
              "--topic", TOPIC, *as_agent, check=False)
    assert cp.returncode != 0 and "ClusterAuthorizationFailed" in cp.stderr, cp.stderr

    # The intake role through confluent-kafka's CreateAcls: WRITE on every acl.* topic.
    intake = AclBinding(ResourceType.TOPIC, "acl.", ResourcePatternType.PREFIXED, "User:intake",
                        "*", AclOperation.WRITE, AclPermissionType.ALLOW)
    for f in admin.create_acls([intake]).values():
        f.result(timeout=20)
    described = admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:intake", None,
        AclOperation.ANY, AclPermissionType.ANY)).result(timeout=20)
    assert described == [intake], described
    kp = kafka_python_producer(broker, pki, "intake")
    for i in range(5):
        kp.send(TOPIC, key=b"rack-9", value=f"intake-{i}".encode()).get(timeout=20)
    kp.close(timeout=5)

    listed = kiln("acls", "list", *as_admin).stdout
    rows = [l.split() for l in listed.splitlines()[1:]]
    assert ["User:agent", "ALLOW", "READ", "GROUP", "LITERAL", "burnin", "*"] in rows, listed
    assert ["User:intake", "ALLOW", "WRITE", "TOPIC", "PREFIXED", "acl.", "*"] in rows, listed
    assert len(rows) == 3, listed

    # A DENY for intake on this one topic beats its prefixed ALLOW.
    kiln("acls", "create", "--principal", "User:intake", "--deny", "--operation", "write",
         "--topic", TOPIC, *as_admin)
    err = produce_error(broker, pki, "intake")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    # Deleting the agent's topic ACL takes its read away; its group ACL stays.
    out = kiln("acls", "delete", "--principal", "User:agent", "--topic", TOPIC, *as_admin).stdout
    assert "1 ACL(s) deleted" in out, out
    values, errors = consume_in_group(broker, pki, "agent", "burnin", 1, timeout_s=15)
    assert values == [] and errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, \
        (values, errors)
    cp = kiln("acls", "delete", *as_admin, check=False)
    assert cp.returncode != 0 and "--all" in cp.stderr, cp.stderr
    assert "3 ACL(s) deleted" in kiln("acls", "delete", "--all", *as_admin).stdout
    assert len(kiln("acls", "list", *as_admin).stdout.splitlines()) == 1
    assert "refused by the ACLs" in broker.log_tail()


def test_a_broker_without_authorization_answers_security_disabled(broker):
    cp = kiln("acls", "list", "--bootstrap", broker.addr, check=False)
    assert cp.returncode != 0 and "SecurityDisabled" in cp.stderr, cp.stderr
