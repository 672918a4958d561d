//! Interop with an independent Kafka codec (the `kafka-protocol` crate the broker uses):
//! batches it encodes are accepted, stored and served byte-exact except for the stamped base
//! offset and leader epoch (the entry's term), control batches between them are never served,
//! and what is served decodes (CRC included) to the same records at the assigned offsets. Also
//! cross-checks the test helper's batch builder against it.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::{Bytes, BytesMut};
use common::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kiln_log::{BatchHeader, ControlKind, EntryBody, NewEntry};

fn record(
    offset: i64,
    ts: i64,
    key: Option<&'static [u8]>,
    value: Option<&'static [u8]>,
) -> Record {
    let mut headers = kafka_protocol::indexmap::IndexMap::new();
    if offset % 2 == 0 {
        headers.insert(
            StrBytes::from_static_str("trace"),
            Some(Bytes::from_static(b"abc")),
        );
    }
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        // The codec starts a new batch when offset - sequence changes.
        sequence: offset as i32,
        timestamp: ts,
        key: key.map(Bytes::from_static),
        value: value.map(Bytes::from_static),
        headers,
    }
}

fn encode(records: &[Record]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut buf, records, &options).unwrap();
    buf.to_vec()
}

#[test]
fn batches_from_a_kafka_codec_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open_real(dir.path(), small_config());
    let produced: Vec<Vec<Record>> = (0..30)
        .map(|b| {
            (0..1 + b % 4)
                .map(|i| {
                    record(
                        i,
                        10_000 + b * 10 + i,
                        Some(b"key"),
                        if i == 1 { None } else { Some(b"value") },
                    )
                })
                .collect()
        })
        .collect();
    // A producer sends several batches in one request: one entry of two at a time, in term 3,
    // with a Raft-only entry (a blank) now and then.
    const TERM: u64 = 3;
    for (i, pair) in produced.chunks(2).enumerate() {
        let mut buf = Vec::new();
        for batch in pair {
            buf.extend(encode(batch));
        }
        let index = log.tail().next_index;
        let mut entries = vec![NewEntry {
            index,
            term: TERM,
            body: EntryBody::Records(buf.into()),
        }];
        if i % 4 == 1 {
            entries.push(NewEntry {
                index: index + 1,
                term: TERM,
                body: EntryBody::Control(ControlKind::Blank, Bytes::new()),
            });
        }
        log.append(&mut entries, 0).unwrap();
    }
    let mut served = Vec::new();
    let mut offset = 0;
    while offset < log.log_end_offset() {
        let r = log.read(offset, 700, i64::MAX).unwrap();
        served.extend_from_slice(&r.records);
        offset = r.next_offset;
    }
    let sets = RecordBatchDecoder::decode_all(&mut Bytes::from(served.clone())).unwrap();
    assert_eq!(sets.len(), produced.len());
    let mut next = 0;
    for (set, sent) in sets.iter().zip(&produced) {
        assert_eq!(set.records.len(), sent.len());
        for (got, want) in set.records.iter().zip(sent) {
            let mut want = want.clone();
            want.offset += next;
            want.partition_leader_epoch = TERM as i32;
            assert_eq!(got, &want);
        }
        next += sent.len() as i64;
    }
    // Byte-exact apart from the base offset (bytes 0..8) and the leader epoch (12..16).
    let stored = split_batches(&served);
    assert_eq!(stored.len(), produced.len(), "no control batch is served");
    for (i, (s, sent)) in stored.iter().zip(&produced).enumerate() {
        let header = BatchHeader::parse(s).unwrap();
        assert_eq!(header.partition_leader_epoch, TERM as i32, "batch {i}");
        let mut original = encode(sent);
        original[..8].copy_from_slice(&s[..8]);
        original[12..16].copy_from_slice(&s[12..16]);
        assert_eq!(s, &original, "batch {i}");
    }
}

#[test]
fn test_helper_matches_the_kafka_codec() {
    let recs: Vec<Rec> = vec![
        (Some(b"k".to_vec()), Some(b"v1".to_vec()), 5_000),
        (None, Some(vec![9; 200]), 5_003),
        (Some(vec![1; 130]), None, 4_999),
    ];
    let ours = build_batch(&recs);
    let set = RecordBatchDecoder::decode(&mut Bytes::from(ours.clone())).unwrap();
    let decoded: Vec<Rec> = set
        .records
        .iter()
        .map(|r| {
            (
                r.key.as_ref().map(|b| b.to_vec()),
                r.value.as_ref().map(|b| b.to_vec()),
                r.timestamp,
            )
        })
        .collect();
    assert_eq!(decoded, recs);
    assert_eq!(
        set.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // And the codec's encoding of the same records has the same header fields, except that it
    // takes the smallest timestamp as baseTimestamp where the Java producer (and our helper)
    // take the first record's; both are valid, deltas are signed.
    let theirs = encode(
        &set.records
            .iter()
            .map(|r| Record {
                headers: Default::default(),
                ..r.clone()
            })
            .collect::<Vec<_>>(),
    );
    let (a, b) = (
        BatchHeader::parse(&ours).unwrap(),
        BatchHeader::parse(&theirs).unwrap(),
    );
    assert_eq!(
        (
            a.batch_length,
            a.last_offset_delta,
            a.max_timestamp,
            a.record_count
        ),
        (
            b.batch_length,
            b.last_offset_delta,
            b.max_timestamp,
            b.record_count
        )
    );
}
