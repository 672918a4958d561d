"""A minimal, hand-written Kafka wire-protocol client for tests that must send
bytes no real client would send (tests/test_bad_input.py) or look at bytes a
real client hides (stored batch attributes, CRCs).

Only non-flexible request versions are used (request header v1, response
header v0), from the Kafka protocol guide:

  Request  = int32 size, int16 api_key, int16 api_version, int32 correlation_id,
             nullable_string client_id, body
  Response = int32 size, int32 correlation_id, body

RecordBatch v2 (magic 2):
  int64 baseOffset | int32 batchLength | int32 partitionLeaderEpoch | int8 magic
  | uint32 crc (CRC-32C of everything from attributes to the end)
  | int16 attributes | int32 lastOffsetDelta | int64 baseTimestamp
  | int64 maxTimestamp | int64 producerId | int16 producerEpoch
  | int32 baseSequence | int32 recordCount | records...
Record:
  varint length | int8 attributes | varlong timestampDelta | varint offsetDelta
  | varint keyLength | key | varint valueLength | value | varint headerCount ...
"""

from __future__ import annotations

import itertools
import socket
import struct
import time

# --------------------------------------------------------------------------
# CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table driven


def _make_crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283, "CRC-32C check value"

# --------------------------------------------------------------------------
# primitive encoders


def i8(v: int) -> bytes: return struct.pack(">b", v)
def i16(v: int) -> bytes: return struct.pack(">h", v)
def i32(v: int) -> bytes: return struct.pack(">i", v)
def i64(v: int) -> bytes: return struct.pack(">q", v)
def u32(v: int) -> bytes: return struct.pack(">I", v)


def string(s: str | None) -> bytes:
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def nbytes(b: bytes | None) -> bytes:
    if b is None:
        return i32(-1)
    return i32(len(b)) + b


def array(items: list[bytes]) -> bytes:
    return i32(len(items)) + b"".join(items)


def uvarint(v: int) -> bytes:
    out = bytearray()
    while True:
        if v < 0x80:
            out.append(v)
            return bytes(out)
        out.append((v & 0x7F) | 0x80)
        v >>= 7


def varint(v: int) -> bytes:
    """Zigzag-encoded signed varint/varlong."""
    return uvarint((v << 1) ^ (v >> 63))


def compact_string(s: str) -> bytes:
    b = s.encode()
    return uvarint(len(b) + 1) + b


# --------------------------------------------------------------------------
# decoding


class Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"short read: want {n} at {self.pos}, have {len(self.data)}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def i8(self) -> int: return struct.unpack(">b", self.take(1))[0]
    def i16(self) -> int: return struct.unpack(">h", self.take(2))[0]
    def i32(self) -> int: return struct.unpack(">i", self.take(4))[0]
    def i64(self) -> int: return struct.unpack(">q", self.take(8))[0]
    def u32(self) -> int: return struct.unpack(">I", self.take(4))[0]

    def string(self) -> str | None:
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def nbytes(self) -> bytes | None:
        n = self.i32()
        return None if n < 0 else self.take(n)

    def uvarint(self) -> int:
        shift = v = 0
        while True:
            b = self.take(1)[0]
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return v
            shift += 7

    def varint(self) -> int:
        v = self.uvarint()
        return (v >> 1) ^ -(v & 1)

    def remaining(self) -> int:
        return len(self.data) - self.pos


# --------------------------------------------------------------------------
# API keys and error codes used here

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
FIND_COORDINATOR = 10
API_VERSIONS = 18

NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
UNSUPPORTED_VERSION = 35
INVALID_RECORD = 87

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = range(5)

# --------------------------------------------------------------------------
# connection


class ConnectionClosed(Exception):
    pass


class Conn:
    """One TCP connection; request/response with correlation ids."""

    def __init__(self, addr: str, timeout_s: float = 10.0, client_id: str | None = "kiln-raw-test"):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.settimeout(timeout_s)
        self.client_id = client_id
        self._corr = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(i32(len(payload)) + payload)

    def header(self, api_key: int, api_version: int, corr: int) -> bytes:
        return i16(api_key) + i16(api_version) + i32(corr) + string(self.client_id)

    def send_request(self, api_key: int, api_version: int, body: bytes,
                     corr: int | None = None, flexible_header: bool = False) -> int:
        corr = next(self._corr) if corr is None else corr
        hdr = self.header(api_key, api_version, corr)
        if flexible_header:
            hdr += uvarint(0)  # request header v2: empty tagged fields
        self.send_frame(hdr + body)
        return corr

    def recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionClosed(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def recv_frame(self) -> bytes:
        size = struct.unpack(">i", self.recv_exact(4))[0]
        assert 0 <= size <= 256 * 1024 * 1024, f"response size {size} is not sane"
        return self.recv_exact(size)

    def recv_response(self, corr: int) -> Reader:
        frame = self.recv_frame()
        r = Reader(frame)
        got = r.i32()
        assert got == corr, f"correlation id {got}, expected {corr}"
        return r

    def request(self, api_key: int, api_version: int, body: bytes, **kw) -> Reader:
        return self.recv_response(self.send_request(api_key, api_version, body, **kw))

    def wait_closed_or_data(self, timeout_s: float) -> str:
        """Returns 'closed' (EOF or reset), 'data' (bytes arrived) or 'open' (neither, by timeout)."""
        self.sock.settimeout(0.2)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                try:
                    chunk = self.sock.recv(65536)
                except socket.timeout:
                    continue
                except (ConnectionResetError, BrokenPipeError):
                    return "closed"
                return "data" if chunk else "closed"
            return "open"
        finally:
            self.sock.settimeout(10.0)


# --------------------------------------------------------------------------
# requests and responses


def api_versions_v0(conn: Conn) -> tuple[int, dict[int, tuple[int, int]]]:
    r = conn.request(API_VERSIONS, 0, b"")
    return parse_api_versions_v0(r)


def parse_api_versions_v0(r: Reader) -> tuple[int, dict[int, tuple[int, int]]]:
    err = r.i16()
    n = r.i32()
    apis = {}
    for _ in range(max(n, 0)):
        key, lo, hi = r.i16(), r.i16(), r.i16()
        apis[key] = (lo, hi)
    return err, apis


def metadata_v1(conn: Conn, topics: list[str] | None) -> dict:
    """Metadata v1. Returns {'brokers': [...], 'controller': id, 'topics': {name: (err, {p: (err, leader)})}}."""
    body = i32(-1) if topics is None else array([string(t) for t in topics])
    r = conn.request(METADATA, 1, body)
    brokers = []
    for _ in range(r.i32()):
        brokers.append((r.i32(), r.string(), r.i32(), r.string()))
    controller = r.i32()
    out = {}
    for _ in range(r.i32()):
        terr, name, _internal = r.i16(), r.string(), r.i8()
        parts = {}
        for _ in range(r.i32()):
            perr, p, leader = r.i16(), r.i32(), r.i32()
            [r.i32() for _ in range(r.i32())]  # replicas
            [r.i32() for _ in range(r.i32())]  # isr
            parts[p] = (perr, leader)
        out[name] = (terr, parts)
    return {"brokers": brokers, "controller": controller, "topics": out}


def record(offset_delta: int, ts_delta: int, key: bytes | None, value: bytes | None) -> bytes:
    body = (i8(0) + varint(ts_delta) + varint(offset_delta)
            + (varint(-1) if key is None else varint(len(key)) + key)
            + (varint(-1) if value is None else varint(len(value)) + value)
            + varint(0))
    return varint(len(body)) + body


def record_batch(records: list[tuple[bytes | None, bytes | None]], base_ts_ms: int,
                 corrupt_crc: bool = False, count_override: int | None = None,
                 last_offset_delta_override: int | None = None,
                 truncate_by: int = 0) -> bytes:
    """Builds an uncompressed RecordBatch v2; the knobs break it on purpose."""
    recs = b"".join(record(i, i, k, v) for i, (k, v) in enumerate(records))
    n = len(records)
    last_delta = n - 1 if last_offset_delta_override is None else last_offset_delta_override
    after_crc = (i16(0) + i32(last_delta) + i64(base_ts_ms) + i64(base_ts_ms + n - 1)
                 + i64(-1) + i16(-1) + i32(-1)
                 + i32(n if count_override is None else count_override) + recs)
    crc = crc32c(after_crc)
    if corrupt_crc:
        crc ^= 0xDEADBEEF
    after_len = i32(0) + i8(2) + u32(crc) + after_crc  # leader epoch, magic, crc, rest
    batch = i64(0) + i32(len(after_len)) + after_len
    if truncate_by:
        batch = batch[:-truncate_by]
    return batch


def produce_v3(conn: Conn, topic: str, partition: int, records_bytes: bytes,
               acks: int = -1, timeout_ms: int = 10000) -> tuple[int, int]:
    """Produce v3 with one partition; returns (error_code, base_offset)."""
    body = (string(None) + i16(acks) + i32(timeout_ms)
            + array([string(topic) + array([i32(partition) + nbytes(records_bytes)])]))
    r = conn.request(PRODUCE, 3, body)
    result = None
    for _ in range(r.i32()):
        name = r.string()
        for _ in range(r.i32()):
            p, err, base, _log_append_time = r.i32(), r.i16(), r.i64(), r.i64()
            if name == topic and p == partition:
                result = (err, base)
    _throttle = r.i32()
    assert result is not None, f"no response for {topic}/{partition}"
    return result


def fetch_v4(conn: Conn, topic: str, partition: int, offset: int,
             max_bytes: int = 4 * 1024 * 1024, max_wait_ms: int = 500,
             min_bytes: int = 1) -> tuple[int, int, bytes]:
    """Fetch v4, one partition; returns (error_code, high_watermark, records bytes)."""
    body = (i32(-1) + i32(max_wait_ms) + i32(min_bytes) + i32(max_bytes) + i8(0)
            + array([string(topic) + array([i32(partition) + i64(offset) + i32(max_bytes)])]))
    r = conn.request(FETCH, 4, body)
    _throttle = r.i32()
    result = None
    for _ in range(r.i32()):
        name = r.string()
        for _ in range(r.i32()):
            p, err, hw, _lso = r.i32(), r.i16(), r.i64(), r.i64()
            n_aborted = r.i32()
            for _ in range(max(n_aborted, 0)):
                r.i64(), r.i64()
            recs = r.nbytes() or b""
            if name == topic and p == partition:
                result = (err, hw, recs)
    assert result is not None, f"no fetch response for {topic}/{partition}"
    return result


class Batch:
    def __init__(self, base_offset: int, attributes: int, last_offset_delta: int,
                 record_count: int, crc: int, crc_ok: bool, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1):
        self.base_offset = base_offset
        self.attributes = attributes
        self.codec = attributes & 0x7
        self.last_offset_delta = last_offset_delta
        self.record_count = record_count
        self.crc = crc
        self.crc_ok = crc_ok
        # -1, -1, -1 unless an idempotent producer wrote the batch.
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence

    def __repr__(self):
        return (f"Batch(base={self.base_offset}, codec={self.codec}, count={self.record_count}, "
                f"crc_ok={self.crc_ok}, producer={self.producer_id}/{self.producer_epoch}, "
                f"seq={self.base_sequence})")


def parse_batches(data: bytes) -> list[Batch]:
    """Parses the record batches in a Fetch response; a partial batch at the end is ignored
    (brokers may cut the last batch at max_bytes)."""
    out = []
    pos = 0
    while len(data) - pos >= 12:
        base, length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + length
        if end > len(data):
            break
        magic = data[pos + 16]
        assert magic == 2, f"batch at offset {base} has magic {magic}"
        (crc,) = struct.unpack_from(">I", data, pos + 17)
        attrs, last_delta = struct.unpack_from(">hi", data, pos + 21)
        pid, pepoch, seq, count = struct.unpack_from(">qhii", data, pos + 43)
        out.append(Batch(base, attrs, last_delta, count, crc, crc32c(data[pos + 21:end]) == crc,
                         pid, pepoch, seq))
        pos = end
    return out
