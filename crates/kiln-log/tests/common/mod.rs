//! Test helpers: build valid Kafka RecordBatch v2 bytes and decode them back, open logs on the
//! real or the simulated file system, append entries and read everything back.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kiln_log::fs::{Fs, RealFs};
use kiln_log::sim_fs::{SimFs, SyncBehaviour};
use kiln_log::{
    BatchHeader, ControlKind, EntryBody, Log, LogConfig, NewEntry, ReadMode, StoredBody,
};

/// A record as the tests see it: key, value, timestamp (ms).
pub type Rec = (Option<Vec<u8>>, Option<Vec<u8>>, i64);

/// Zig-zag varint (Kafka's `varint`/`varlong`, protobuf style).
pub fn put_varlong(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

pub fn get_varlong(buf: &[u8], at: &mut usize) -> i64 {
    let mut z = 0u64;
    let mut shift = 0;
    loop {
        let b = buf[*at];
        *at += 1;
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

fn put_bytes(out: &mut Vec<u8>, b: &Option<Vec<u8>>) {
    match b {
        None => put_varlong(out, -1),
        Some(b) => {
            put_varlong(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

/// Builds one RecordBatch v2 (no compression, no headers, producer id -1) with a correct CRC32C.
/// The base offset is 0; the log stamps it.
pub fn build_batch(records: &[Rec]) -> Vec<u8> {
    assert!(!records.is_empty());
    let base_ts = records[0].2;
    let max_ts = records.iter().map(|r| r.2).max().unwrap();
    let mut body = Vec::new();
    for (i, (key, value, ts)) in records.iter().enumerate() {
        let mut rec = vec![0u8]; // attributes
        put_varlong(&mut rec, ts - base_ts);
        put_varlong(&mut rec, i as i64);
        put_bytes(&mut rec, key);
        put_bytes(&mut rec, value);
        put_varlong(&mut rec, 0); // no headers
        put_varlong(&mut body, rec.len() as i64);
        body.extend_from_slice(&rec);
    }
    let mut b = Vec::with_capacity(61 + body.len());
    b.extend_from_slice(&0i64.to_be_bytes()); // baseOffset
    b.extend_from_slice(&((49 + body.len()) as i32).to_be_bytes()); // batchLength
    b.extend_from_slice(&(-1i32).to_be_bytes()); // partitionLeaderEpoch
    b.push(2); // magic
    b.extend_from_slice(&[0; 4]); // crc, filled below
    b.extend_from_slice(&0i16.to_be_bytes()); // attributes
    b.extend_from_slice(&((records.len() - 1) as i32).to_be_bytes()); // lastOffsetDelta
    b.extend_from_slice(&base_ts.to_be_bytes());
    b.extend_from_slice(&max_ts.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes()); // producerId
    b.extend_from_slice(&(-1i16).to_be_bytes()); // producerEpoch
    b.extend_from_slice(&(-1i32).to_be_bytes()); // baseSequence
    b.extend_from_slice(&(records.len() as i32).to_be_bytes());
    b.extend_from_slice(&body);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Decodes the records of one uncompressed batch: (offset, key, value, timestamp).
pub fn decode_batch(batch: &[u8]) -> Vec<(i64, Rec)> {
    let h = BatchHeader::parse(batch).unwrap();
    let mut at = 61;
    let mut out = Vec::new();
    let get_bytes = |at: &mut usize| -> Option<Vec<u8>> {
        let len = get_varlong(batch, at);
        if len < 0 {
            return None;
        }
        let v = batch[*at..*at + len as usize].to_vec();
        *at += len as usize;
        Some(v)
    };
    for _ in 0..h.record_count {
        let len = get_varlong(batch, &mut at) as usize;
        let end = at + len;
        at += 1; // attributes
        let ts_delta = get_varlong(batch, &mut at);
        let off_delta = get_varlong(batch, &mut at);
        let key = get_bytes(&mut at);
        let value = get_bytes(&mut at);
        let headers = get_varlong(batch, &mut at);
        assert_eq!(headers, 0);
        assert_eq!(at, end);
        out.push((
            h.base_offset + off_delta,
            (key, value, h.base_timestamp + ts_delta),
        ));
    }
    assert_eq!(at, batch.len());
    out
}

/// A batch of `n` records with values of `value_len` bytes (filled with `fill`) at `ts`.
pub fn batch_of(n: usize, value_len: usize, fill: u8, ts: i64) -> Vec<u8> {
    let recs: Vec<Rec> = (0..n)
        .map(|i| {
            (
                Some(format!("k{i}").into_bytes()),
                Some(vec![fill; value_len]),
                ts,
            )
        })
        .collect();
    build_batch(&recs)
}

/// Splits a buffer of concatenated batches.
pub fn split_batches(mut buf: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let h = BatchHeader::parse(buf).unwrap();
        let (b, rest) = buf.split_at(h.total_len());
        out.push(b.to_vec());
        buf = rest;
    }
    out
}

/// Reads every data batch from the logical start up to `max_offset`, in `max_bytes` chunks.
pub fn read_all(log: &Log, max_bytes: usize, max_offset: i64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    loop {
        let r = log.read(offset, max_bytes, max_offset).unwrap();
        if r.records.is_empty() {
            break;
        }
        assert!(r.next_offset > offset);
        out.extend(split_batches(&r.records));
        offset = r.next_offset;
    }
    out
}

/// Small segments, a small index interval and frequent checkpoints, to exercise everything.
pub fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096 + 4096,
        index_interval_bytes: 256,
        checkpoint_interval_bytes: 1024,
        retention_ms: None,
        ..LogConfig::default()
    }
}

pub fn sim() -> SimFs {
    SimFs::new(Duration::from_millis(1), SyncBehaviour::Honest)
}

pub fn open_real(dir: &Path, config: LogConfig) -> (Log, kiln_log::RecoveryReport) {
    Log::open(Arc::new(RealFs) as Arc<dyn Fs>, dir, config).unwrap()
}

pub fn open_sim(fs: &SimFs, config: LogConfig) -> (Log, kiln_log::RecoveryReport) {
    Log::open(
        Arc::new(fs.clone()) as Arc<dyn Fs>,
        Path::new("/log"),
        config,
    )
    .unwrap()
}

/// What a test appends: records (one batch per record count) or a control payload.
#[derive(Debug, Clone)]
pub enum Spec {
    Data(Vec<Vec<u8>>),
    Control(ControlKind, Vec<u8>),
}

/// Appends one entry at the tail in `term`.
pub fn append(log: &Log, term: u64, spec: &Spec) {
    let index = log.tail().next_index;
    let body = match spec {
        Spec::Data(batches) => batches.concat(),
        Spec::Control(_, p) => p.clone(),
    };
    let entry = NewEntry {
        index,
        term,
        body: match spec {
            Spec::Data(_) => EntryBody::Records(body.into()),
            Spec::Control(kind, _) => EntryBody::Control(*kind, body.into()),
        },
    };
    log.append(&mut [entry], 1_000).unwrap();
}

/// A data entry of `batches` batches of `records` records each, values filled with `fill`.
pub fn data(batches: usize, records: usize, fill: u8) -> Spec {
    Spec::Data(
        (0..batches)
            .map(|_| batch_of(records, 100, fill, 1_000))
            .collect(),
    )
}

/// Every entry of the log as (index, term, kafka offset, records or -1 for control).
pub fn entries(log: &Log) -> Vec<(u64, u64, i64, i64)> {
    let (first, _) = log.first();
    let tail = log.tail().next_index;
    log.read_entries(first, tail, usize::MAX, ReadMode::Full)
        .unwrap()
        .into_iter()
        .map(|e| {
            let n = match &e.body {
                StoredBody::Control { .. } => -1,
                _ => i64::from(e.kafka_records()),
            };
            (e.index, e.term, e.kafka_offset, n)
        })
        .collect()
}

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(f)
}
