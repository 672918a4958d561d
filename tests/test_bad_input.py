"""Malformed and hostile input on raw sockets (no client library).

After every bad input the broker must still be alive, answer a normal client
on a new connection, and serve the data it acknowledged before. Each test runs
against a broker of one and against the partition leader of a three-broker
cluster.
Request bytes are built by hand in tests/kafka_raw.py.
"""

from __future__ import annotations

import random
import socket
import struct
import time

import pytest

import kafka_raw as kr
from kiln_cluster import Cluster
from kiln_testlib import Delivered, create_topic, flush_all, rdk_producer, read_partition, watermarks

SEED_TOPIC = "acked"
SEED_VALUES = [f"acked-{i}".encode() for i in range(20)]


@pytest.fixture(params=["one broker", "three brokers"])
def seeded(request, make_broker, tmp_path):
    """A broker holding 20 acks=all records in SEED_TOPIC/0: a broker of one, or the leader of
    that partition in a three-broker cluster (replication factor 3), so every bad input below
    meets a partition replicated on three brokers as well."""
    if request.param == "one broker":
        broker = make_broker()
        create_topic(broker, SEED_TOPIC, 1)
    else:
        cluster = Cluster(tmp_path / "cluster")
        request.node.kiln_brokers = [cluster.nodes[i] for i in cluster.ids]
        def close():
            died = cluster.close()
            if died:
                pytest.fail("kiln broker died during the test: " + "; ".join(died), pytrace=False)

        request.addfinalizer(close)
        cluster.start_all()
        cluster.create_topic(SEED_TOPIC, 1)
        leader, _ = cluster.wait_leader(SEED_TOPIC, 0)
        broker = cluster.node(leader)
    p = rdk_producer(broker, acks="all")
    d = Delivered()
    for v in SEED_VALUES:
        p.produce(SEED_TOPIC, value=v, partition=0, on_delivery=d.cb)
    flush_all(p, len(SEED_VALUES), d)
    assert not d.failed, d.failed[:3]
    return broker


def assert_healthy(broker, extra: list[bytes] = ()) -> None:
    """Alive, answers ApiVersions on a fresh connection, and the acked data reads back."""
    broker.assert_alive()
    with kr.Conn(broker.addr) as c:
        err, apis = kr.api_versions_v0(c)
    assert err == 0 and kr.API_VERSIONS in apis, (err, apis)
    recs = read_partition(broker, SEED_TOPIC, 0)
    assert [r.value for r in recs] == SEED_VALUES + list(extra)
    broker.assert_alive()


# DESIGN.md: never a dropped connection without a log line.
CLOSE_LOGGED = r"(WARN|ERROR)[^\n]*"


def wait_eof(conn: kr.Conn, timeout_s: float) -> bool:
    """Reads (and discards) until EOF/reset; True if the broker closed within timeout_s."""
    conn.sock.settimeout(0.2)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if not conn.sock.recv(65536):
                return True
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


# --------------------------------------------------------------------------
# framing


def test_truncated_frame_then_eof(seeded):
    with kr.Conn(seeded.addr) as c:
        c.send_raw(kr.i32(100) + b"\x00\x12\x00\x00\x00\x00\x00\x07ab")  # 10 of 100 bytes
        c.sock.shutdown(socket.SHUT_WR)
        assert wait_eof(c, 10), "broker kept a half-closed connection with a partial frame open"
    assert_healthy(seeded)


def test_truncated_request_header(seeded):
    """A complete 3-byte frame: api_key and half an api_version, no correlation id."""
    n0 = len(seeded.log_text())
    with kr.Conn(seeded.addr) as c:
        c.send_frame(b"\x00\x12\x00")
        assert wait_eof(c, 10), "a frame too short for a request header must close the connection"
    seeded.wait_log(CLOSE_LOGGED, n0)
    assert_healthy(seeded)


def test_truncated_request_body(seeded):
    """Metadata v1 whose topic array says 5 entries and holds none."""
    n0 = len(seeded.log_text())
    with kr.Conn(seeded.addr) as c:
        c.send_frame(c.header(kr.METADATA, 1, 99) + kr.i32(5))
        state = c.wait_closed_or_data(10)
        assert state != "open", "broker neither answered nor closed after a complete bad frame"
    if state == "closed":
        seeded.wait_log(CLOSE_LOGGED, n0)
    assert_healthy(seeded)


@pytest.mark.parametrize("prefix", [
    b"\x7f\xff\xff\xff",  # 2 GiB - 1
    b"\x40\x00\x00\x00",  # 1 GiB
    b"\x80\x00\x00\x00",  # 2 GiB as u32, i32::MIN as Kafka's signed size
    b"\xff\xff\xff\xff",  # -1
], ids=["2GiB-1", "1GiB", "2GiB_negative", "minus1"])
def test_huge_or_negative_size_prefix(seeded, prefix):
    rss_before = seeded.rss_kib()
    n0 = len(seeded.log_text())
    with kr.Conn(seeded.addr) as c:
        # A plausible request header follows, then nothing: the broker must
        # refuse on the size alone instead of waiting for (or allocating) it.
        c.send_raw(prefix + c.header(kr.API_VERSIONS, 0, 1))
        assert wait_eof(c, 5), f"size prefix {prefix.hex()} did not close the connection within 5 s"
    seeded.wait_log(CLOSE_LOGGED, n0)
    rss_after = seeded.rss_kib()
    assert rss_after - rss_before < 256 * 1024, (
        f"broker RSS grew from {rss_before} KiB to {rss_after} KiB on a {prefix.hex()} prefix")
    assert_healthy(seeded)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_garbage_bytes(seeded, seed):
    rng = random.Random(seed)
    with kr.Conn(seeded.addr) as c:
        c.send_raw(bytes(rng.getrandbits(8) for _ in range(4096)))
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # already closed by the broker
        assert wait_eof(c, 10), "broker did not close a connection that sent garbage then EOF"
    assert_healthy(seeded)


@pytest.mark.parametrize("seed", [4, 5])
def test_garbage_inside_a_frame(seeded, seed):
    rng = random.Random(seed)
    n0 = len(seeded.log_text())
    with kr.Conn(seeded.addr) as c:
        c.send_frame(bytes(rng.getrandbits(8) for _ in range(64)))
        state = c.wait_closed_or_data(10)
        assert state != "open", "no answer and no close for a garbage frame"
    if state == "closed":
        seeded.wait_log(CLOSE_LOGGED, n0)
    assert_healthy(seeded)


# --------------------------------------------------------------------------
# unknown and unsupported requests


def expect_error_or_close(broker, c: kr.Conn, corr: int, n0: int) -> str:
    """After an unanswerable request: either the connection closes with a log
    line saying why, or a response with the same correlation id arrives and the
    connection keeps working."""
    c.sock.settimeout(10)
    try:
        frame = c.recv_frame()
    except (kr.ConnectionClosed, ConnectionResetError):
        return "closed: " + broker.wait_log(CLOSE_LOGGED, n0)
    except socket.timeout:
        raise AssertionError("neither a response nor a close within 10 s") from None
    got = struct.unpack(">i", frame[:4])[0]
    assert got == corr, f"response correlation id {got}, expected {corr}"
    err, apis = kr.api_versions_v0(c)  # the connection is still usable
    assert err == 0 and apis
    return "error response"


def test_unknown_api_key(seeded):
    n0 = len(seeded.log_text())
    with kr.Conn(seeded.addr) as c:
        corr = c.send_request(9999, 0, b"", corr=4242)
        print("unknown api key:", expect_error_or_close(seeded, c, corr, n0))
    assert_healthy(seeded)


def test_unsupported_version_of_other_api(seeded):
    n0 = len(seeded.log_text())
    with kr.Conn(seeded.addr) as c:
        corr = c.send_request(kr.METADATA, 999, kr.i32(-1), corr=4243)
        print("Metadata v999:", expect_error_or_close(seeded, c, corr, n0))
    assert_healthy(seeded)


ADD_PARTITIONS_TO_TXN = 24  # a real Kafka API that Kiln does not serve (no transactions)


def test_not_advertised_api(seeded):
    """A real Kafka API the broker does not list in ApiVersions (AddPartitionsToTxn)."""
    with kr.Conn(seeded.addr) as c:
        _, apis = kr.api_versions_v0(c)
        assert ADD_PARTITIONS_TO_TXN not in apis, "AddPartitionsToTxn is advertised now: pick another API"
        n0 = len(seeded.log_text())
        # AddPartitionsToTxn v0: transactional_id, producer_id, producer_epoch, topics [].
        body = kr.i16(1) + b"t" + struct.pack(">q", 1) + kr.i16(0) + kr.i32(0)
        corr = c.send_request(ADD_PARTITIONS_TO_TXN, 0, body, corr=4244)
        print("AddPartitionsToTxn v0:", expect_error_or_close(seeded, c, corr, n0))
    assert_healthy(seeded)


def test_api_versions_unsupported_version(seeded):
    """KIP-511: an ApiVersions request newer than the broker knows gets an
    ApiVersions v0 response with UNSUPPORTED_VERSION (35) and the broker's
    ApiVersions range, so the client can retry with a version it supports."""
    with kr.Conn(seeded.addr) as c:
        err, apis = kr.api_versions_v0(c)
    assert err == 0 and kr.API_VERSIONS in apis
    max_v = apis[kr.API_VERSIONS][1]
    for version in sorted({max_v + 1, 127}):
        with kr.Conn(seeded.addr) as c:
            body = kr.compact_string("kiln-tests") + kr.compact_string("1.0") + kr.uvarint(0)
            corr = c.send_request(kr.API_VERSIONS, version, body, corr=500 + version,
                                  flexible_header=True)
            r = c.recv_response(corr)
            err, got = kr.parse_api_versions_v0(r)
            assert err == kr.UNSUPPORTED_VERSION, f"ApiVersions v{version}: error {err}, want 35"
            assert kr.API_VERSIONS in got, f"ApiVersions v{version}: no ApiVersions range in {got}"
            assert got[kr.API_VERSIONS][0] == 0 and got[kr.API_VERSIONS][1] == max_v, got
    assert_healthy(seeded)


# --------------------------------------------------------------------------
# bad record batches in Produce v3


def produce_good(c: kr.Conn, values: list[bytes]) -> tuple[int, int]:
    return kr.produce_v3(c, SEED_TOPIC, 0, kr.record_batch([(None, v) for v in values],
                                                            int(time.time() * 1000)))


def test_raw_produce_positive_control(seeded):
    """The hand-built Produce v3 / RecordBatch v2 is accepted, so the corrupt
    variants below fail for their corruption alone."""
    with kr.Conn(seeded.addr) as c:
        assert produce_good(c, [b"raw-0", b"raw-1"]) == (0, len(SEED_VALUES))
        err, _ = kr.produce_v3(c, "no-such-topic", 0, kr.record_batch([(None, b"x")], 0))
        assert err == kr.UNKNOWN_TOPIC_OR_PARTITION, err
    assert_healthy(seeded, [b"raw-0", b"raw-1"])


BAD_BATCHES = {
    # the CRC-32C does not match the bytes
    "bad_crc": (dict(corrupt_crc=True), {kr.CORRUPT_MESSAGE}),
    # batchLength says more bytes than the request carries
    "truncated": (dict(truncate_by=7), {kr.CORRUPT_MESSAGE, kr.INVALID_RECORD}),
    # valid CRC, but recordCount (3) disagrees with lastOffsetDelta (9): taking
    # it would leave a gap of offsets
    "count_mismatch": (dict(last_offset_delta_override=9), {kr.CORRUPT_MESSAGE, kr.INVALID_RECORD}),
}


@pytest.mark.parametrize("kind", list(BAD_BATCHES))
def test_produce_corrupt_batch_rejected(seeded, kind):
    knobs, allowed = BAD_BATCHES[kind]
    batch = kr.record_batch([(b"k", b"bad-0"), (b"k", b"bad-1"), (b"k", b"bad-2")],
                            int(time.time() * 1000), **knobs)
    with kr.Conn(seeded.addr) as c:
        err, base = kr.produce_v3(c, SEED_TOPIC, 0, batch)
        assert err in allowed, f"{kind}: partition error {err}, want one of {sorted(allowed)}"
        # Nothing was appended...
        assert watermarks(seeded, SEED_TOPIC, 0) == (0, len(SEED_VALUES))
        # ...and the next good batch takes the next offset (no gap).
        assert produce_good(c, [b"after"]) == (0, len(SEED_VALUES))
    assert_healthy(seeded, [b"after"])
