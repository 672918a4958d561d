"""ACLs on the Kafka listener, with real clients (docs/security.md, "ACLs").

One broker with `[tls]`, `[sasl]` (SCRAM-SHA-512; `admin` is the bootstrap user and so a super
user) and `[authorization]` (nothing is allowed that no ACL allows). Users `agent`,
`intake` and `dashboard` are made with `kiln users`.

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
- Kiln's own librdkafka services over SASL_SSL, each as its role's user with only the ACLs
  docs/security.md lists for it: `kiln intake register` queues a manifest, a real `kiln agent`
  (its password from `kafka_password_file`)
  burns the nodes in (group `burnin`), retries a failing one ten times and dead-letters it;
  `kiln dashboard`, as `dashboard` with DESCRIBE on the group and the topic, samples burnin's
  lag over SASL_SSL (kiln-client) and shows it drained.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from kiln_testlib import (Broker, broker_pki, clean_env, free_port, kiln, kiln_bin, rdk_consumer, rdk_producer,
                          rdk_sasl, read_values, wait_for_login)

ADMIN_PASSWORD = "acl-admin-secret-41c9"
PASSWORDS = {"agent": "agent-secret-77d1", "intake": "intake-secret-90be",
             "dashboard": "dashboard-secret-5c3a"}
TOPIC = "acl.nodes"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return broker_pki(tmp_path_factory.mktemp("acl-pki"))


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
    as_admin = make_users(broker, pki, tmp_path)
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


def make_users(broker: Broker, pki: Path, tmp_path: Path) -> list[str]:
    """Creates the users of PASSWORDS; returns the CLI flags that log in as admin."""
    as_admin = cli_as(broker, pki, tmp_path, "admin")
    for user in PASSWORDS:
        pw = tmp_path / f"new-{user}.pw"
        pw.write_text(PASSWORDS[user] + "\n")
        kiln("users", "create", user, "--password-file", str(pw), *as_admin)
    return as_admin


def librdkafka_security(pki: Path, user: str) -> dict:
    return {"security.protocol": "SASL_SSL", "ssl.ca.location": str(pki / "ca" / "ca.crt"),
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": PASSWORDS[user]}


@pytest.mark.timeout(240)
def test_kiln_services_run_over_sasl_ssl_with_their_roles_acls(make_broker, tmp_path, pki):
    broker = acl_broker(make_broker, tmp_path, pki)
    as_admin = make_users(broker, pki, tmp_path)
    kiln("topics", "create", "kiln.nodes", "--partitions", "2", *as_admin)
    kiln("topics", "create", "kiln.nodes.dlq", "--partitions", "1", *as_admin)
    # The roles of docs/security.md, "ACLs", and nothing more.
    for acl in (["--principal", "User:intake", "--operation", "write", "--operation", "create",
                 "--topic", "kiln.nodes"],
                ["--principal", "User:agent", "--operation", "read", "--group", "burnin"],
                ["--principal", "User:agent", "--operation", "read", "--operation", "write",
                 "--topic", "kiln.nodes"],
                ["--principal", "User:agent", "--operation", "write", "--topic", "kiln.nodes.dlq"],
                ["--principal", "User:dashboard", "--operation", "describe", "--group", "burnin"],
                ["--principal", "User:dashboard", "--operation", "describe",
                 "--topic", "kiln.nodes"]):
        kiln("acls", "create", "--allow", *acl, *as_admin)

    db_url = f"sqlite://{tmp_path / 'kiln.db'}"
    manifest = tmp_path / "rack.csv"
    manifest.write_text(
        "hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,"
        "firmware_gpu_vbios,firmware_nic\n"
        "gpu-s-01,rack-sec,10.30.0.11,H100-SXM,8,1.10,2.3.1,96.00,28.39\n"
        "gpu-s-02,rack-sec,10.30.0.12,H100-SXM,8,1.10,2.3.1,96.00,28.39\n")
    # The password in a file, not on the command line; the rest as flags.
    security = librdkafka_security(pki, "intake")
    secret = tmp_path / "intake.kafka"
    secret.write_text(f"# intake's librdkafka secrets\nsasl.password={security.pop('sasl.password')}\n")
    intake_flags = [f"--kafka-config={k}={v}" for k, v in security.items()]
    intake = kiln("intake", "register", str(manifest), "--bootstrap", broker.addr,
                  "--database-url", db_url, "--kafka-config-file", str(secret), *intake_flags)

    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(
        "playbook: one-fails\ntimeout_s: 30\nchecks:\n"
        "  - check: scripted\n    name: gpu_ecc\n    outcome: fail\n    hosts: [gpu-s-01]\n"
        "    message: \"GPU 0: 3 uncorrected ECC errors\"\n")
    # The agent's password from a file (kafka_password_file), the rest in [kafka].
    agent_security = librdkafka_security(pki, "agent")
    agent_pw = tmp_path / "agent.kafka-password"
    agent_pw.write_text(agent_security.pop("sasl.password") + "\n")
    kafka = "".join(f'"{k}" = "{v}"\n' for k, v in agent_security.items())
    agent_cfg = tmp_path / "agent.toml"
    agent_cfg.write_text(
        f'bootstrap = "{broker.addr}"\ndatabase_url = "{db_url}"\nagent_id = "agent-sec"\n'
        f'playbook = "{playbook}"\nretry_backoff_ms = 10\nretry_backoff_max_ms = 20\n'
        f'session_timeout_ms = 6000\nmetrics_listen = "off"\n'
        f'kafka_password_file = "{agent_pw}"\n[kafka]\n{kafka}')
    log = tmp_path / "agent.log"
    with open(log, "wb") as f:
        agent = subprocess.Popen([kiln_bin(), "agent", "--config", str(agent_cfg)],
                                 stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=clean_env())
    try:
        want = {"gpu-s-01": "dead_lettered", "gpu-s-02": "passed"}
        deadline = time.monotonic() + 120
        while True:
            states = {}
            for host in want:
                cp = kiln("nodes", "show", host, "--json", "--database-url", db_url, check=False)
                states[host] = json.loads(cp.stdout)["node"]["state"] if cp.returncode == 0 else None
            if states == want:
                break
            assert agent.poll() is None, f"agent exited\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, \
                f"states {states}\n{log.read_text()[-4000:]}\n{broker.log_tail()}"
            time.sleep(0.3)
    finally:
        agent.terminate()
        agent.wait(timeout=15)
    dashboard_log = dashboard_lag_over_sasl_ssl(broker, pki, tmp_path, db_url)
    # The dead letter is on its topic, read back as admin.
    letters = read_values(broker, "kiln.nodes.dlq", 1, 1, **sasl_as(pki, "admin"))
    assert len(letters) == 1 and "gpu-s-01" in letters[0], letters
    assert "refused by the ACLs" not in broker.log_tail(), broker.log_tail()
    # No password reaches a log of the run: the broker's, the agent's, or the CLI's output.
    logs = {"broker": broker.log_text(), "agent": log.read_text(),
            "intake": intake.stdout + intake.stderr, "dashboard": dashboard_log}
    for user, password in {**PASSWORDS, "admin": ADMIN_PASSWORD}.items():
        for name, text in logs.items():
            assert password not in text, f"{user}'s password is in the {name} log"


def dashboard_lag_over_sasl_ssl(broker: Broker, pki: Path, tmp_path: Path, db_url: str) -> str:
    """`kiln dashboard` samples lag as User:dashboard (DESCRIBE on the group and the topic)
    over SASL_SSL: its /lag page shows burnin's committed offsets on both partitions, lag 0.
    Returns its log."""
    log = tmp_path / "dashboard.log"
    with open(log, "wb") as err:
        dash = subprocess.Popen(
            [kiln_bin(), "dashboard", "--listen", "127.0.0.1:0", "--database-url", db_url,
             "--lag-interval-s", "0.3", *cli_as(broker, pki, tmp_path, "dashboard")],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=clean_env())
    try:
        line = dash.stdout.readline().decode()
        m = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
        assert m, f"no listening line: {line!r}\n{log.read_text()}"
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"{m.group(1)}/lag", timeout=10) as resp:
                page = resp.read().decode()
            rows = re.findall(r"<td>burnin</td><td>kiln\.nodes</td><td class=\"num\">(\d)</td>"
                              r"<td class=\"num\">([^<]+)</td><td class=\"num\">(\d+)</td>"
                              r"<td class=\"num\">(\d+)</td>", page)
            if len(rows) == 2 and all(r[3] == "0" for r in rows) and "The last sample" not in page:
                break
            assert dash.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{rows}\n{page[-2000:]}\n{log.read_text()[-3000:]}"
            time.sleep(0.3)
    finally:
        dash.terminate()
        dash.wait(timeout=15)
    return log.read_text()
