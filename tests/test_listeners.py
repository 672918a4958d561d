"""Several Kafka listeners per broker, each with its own address, advertised address and
security protocol (`[[listeners]]`, docs/security.md "Listeners"), with real clients.

- One broker whose main listener is SASL_SSL (SCRAM-SHA-512) and a second, `local`,
  PLAINTEXT on loopback: librdkafka produces on `local` with no credentials and kafka-python
  reads it back there (each follows Metadata, which names the `local` address), librdkafka
  reads the same records over SASL_SSL on the main one, and `kiln topics list` works on
  `local` with no flags. Each listener refuses the other's protocol.
- Three brokers whose main listener is PLAINTEXT (`security_protocol`, though `[tls]` is set)
  and whose `secure` listener is SSL: a
  librdkafka producer bootstrapped on one broker's SSL address writes acks=all to every
  partition of an RF 3 topic, so it reaches every leader at the SSL address Metadata gives
  for it, and a consumer group over SSL (FindCoordinator on that listener) reads everything.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from kiln_cluster import cluster_fixture
from kiln_testlib import (Broker, Delivered, broker_pki, flush_all, free_port, kiln,
                          rdk_consumer, rdk_producer, rdk_sasl, read_values, wait_for_login)

ADMIN_PASSWORD = "listeners-admin-2f7c"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    root = broker_pki(tmp_path_factory.mktemp("listeners-pki"))
    for node in (1, 2, 3):
        kiln("certs", "broker", "--ca-dir", str(root / "ca"), "--node", str(node),
             "--host", "127.0.0.1", "--out", str(root / "certs"))
    return root


def refuses(port: int, hello: bytes) -> bool:
    """Whether the listener at `port` closes on, or answers with garbage to, a plaintext
    ApiVersions request (a TLS listener does; a plaintext one answers it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(hello)
        try:
            data = s.recv(4)
        except (ConnectionResetError, socket.timeout):
            return True
        return len(data) < 4 or int.from_bytes(data, "big") > 1 << 20


# ApiVersions v0, correlation id 7, client id "t".
API_VERSIONS_V0 = (
    (2 + 2 + 4 + 2 + 1).to_bytes(4, "big") + (18).to_bytes(2, "big") + (0).to_bytes(2, "big")
    + (7).to_bytes(4, "big") + (1).to_bytes(2, "big") + b"t")


@pytest.mark.timeout(120)
def test_a_plaintext_loopback_listener_beside_a_sasl_ssl_one(make_broker, tmp_path, pki):
    main_port, local_port = free_port(), free_port()
    secret = tmp_path / "admin.password"
    secret.write_text(ADMIN_PASSWORD + "\n")
    config = tmp_path / "broker.toml"
    config.write_text(
        f'node_id = 0\nlisten = "127.0.0.1:{main_port}"\ndata_dir = "{tmp_path / "data"}"\n'
        f'metrics_listen = "off"\n\n'
        f'[[listeners]]\nname = "local"\nlisten = "127.0.0.1:{local_port}"\n'
        f'security_protocol = "PLAINTEXT"\n\n'
        f'[tls]\ncert_file = "{pki}/certs/node-0.crt"\nkey_file = "{pki}/certs/node-0.key"\n\n'
        f'[sasl]\nmechanisms = ["SCRAM-SHA-512"]\n'
        f'bootstrap_user = "admin"\nbootstrap_password_file = "{secret}"\n')
    broker = make_broker(port=main_port, config_path=config)
    wait_for_login(broker, pki, "admin", ADMIN_PASSWORD)
    assert f"listener=local security=PLAINTEXT" in broker.log_text(), broker.log_tail()
    local = Broker(tmp_path / "unused", tmp_path / "unused.log", port=local_port)

    kiln("topics", "create", "two.doors", "--partitions", "2", "--bootstrap", local.addr)
    assert "two.doors" in kiln("topics", "list", "--bootstrap", local.addr).stdout

    delivered = Delivered()
    p = rdk_producer(local)
    for i in range(200):
        p.produce("two.doors", key=f"k{i % 7}", value=f"v{i}", on_delivery=delivered.cb)
    flush_all(p, 200, delivered)

    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=local.addr, enable_auto_commit=False,
                      consumer_timeout_ms=10_000)
    c.assign([TopicPartition("two.doors", 0), TopicPartition("two.doors", 1)])
    c.seek_to_beginning()
    via_local = []
    deadline = time.monotonic() + 30
    while len(via_local) < 200 and time.monotonic() < deadline:
        for batch in c.poll(timeout_ms=500).values():
            via_local += [m.value.decode() for m in batch]
    c.close()
    assert sorted(via_local) == sorted(f"v{i}" for i in range(200))

    via_main = read_values(broker, "two.doors", 2, 200, **rdk_sasl(pki, "admin", ADMIN_PASSWORD))
    assert sorted(via_main) == sorted(via_local)

    # Each listener speaks its own protocol only: the main one refuses plaintext, and a
    # SASL_SSL client gets nowhere on the plaintext one.
    assert refuses(main_port, API_VERSIONS_V0)
    assert not refuses(local_port, API_VERSIONS_V0)
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": local.addr, "socket.timeout.ms": 3000,
                         **rdk_sasl(pki, "admin", ADMIN_PASSWORD)})
    with pytest.raises(Exception):
        admin.list_topics(timeout=5)


@pytest.fixture
def ssl_cluster(request, tmp_path, pki):
    ssl_port = {}

    def extra(node_id: int) -> str:
        # The main listener stays PLAINTEXT (security_protocol, set among the top-level
        # settings); [tls] serves the `secure` listener only.
        return (f'[[listeners]]\nname = "secure"\nlisten = "127.0.0.1:{ssl_port[node_id]}"\n'
                f'security_protocol = "SSL"\n\n'
                f'[tls]\ncert_file = "{pki}/certs/node-{node_id}.crt"\n'
                f'key_file = "{pki}/certs/node-{node_id}.key"\n')

    for i in (1, 2, 3):
        ssl_port[i] = free_port()
    yield from cluster_fixture(
        request, tmp_path / "cluster", extra_config=extra,
        settings={"security_protocol": "PLAINTEXT"},
        peer_listeners=lambda i: {"secure": f"127.0.0.1:{ssl_port[i]}"})


@pytest.mark.timeout(180)
def test_every_broker_is_advertised_on_the_listener_the_client_came_in_on(ssl_cluster, pki):
    c = ssl_cluster
    leaders = c.create_topic("ssl.spread", 3, replication_factor=3)
    assert len({leader for leader, _ in leaders.values()}) > 1, \
        f"all partitions led by one broker: {leaders}"
    first = c.nodes[1]
    ssl_addr = c.peer_listeners(1)["secure"]
    ssl = {"bootstrap.servers": ssl_addr, "security.protocol": "SSL",
           "ssl.ca.location": str(pki / "ca" / "ca.crt")}

    delivered = Delivered()
    p = rdk_producer(first, **ssl)
    for i in range(300):
        p.produce("ssl.spread", partition=i % 3, value=f"s{i}", on_delivery=delivered.cb)
    flush_all(p, 300, delivered)

    consumer = rdk_consumer(first, **ssl, **{"group.id": "over-ssl",
                                              "auto.offset.reset": "earliest"})
    consumer.subscribe(["ssl.spread"])
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < 300 and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        assert not m.error(), m.error()
        seen.append(m.value().decode())
    consumer.close()
    assert sorted(seen) == sorted(f"s{i}" for i in range(300))
    # The same topic is described over TLS by the admin CLI too.
    out = kiln("topics", "describe", "ssl.spread", "--bootstrap", ssl_addr,
               "--tls-ca", str(pki / "ca" / "ca.crt")).stdout
    assert "ssl.spread" in out
