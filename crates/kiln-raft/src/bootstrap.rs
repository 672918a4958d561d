//! Writing a single-replica group offline: what taking in data of an older layout needs (the
//! broker's `convert`). The group's log starts at the given Kafka offset (an old partition
//! whose retention had removed its first records keeps its offsets) and gets its membership
//! (this node alone), a blank entry of term 1 and then the given payloads, all in term 1; its vote is this node's in term 1; a data
//! group's state says it applied everything (its high watermark is the log end at once), a
//! table group's that it applied nothing (its table is rebuilt by applying the log when the
//! replica first leads).

use std::collections::BTreeSet;
use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use kiln_log::fs::Fs;
use kiln_log::{ControlKind, EntryBody, Log, LogConfig, NewEntry};
use openraft::{CommittedLeaderId, Membership, StoredMembership};

use crate::log_store::VOTE_FILE;
use crate::payload::Payload;
use crate::record::{encode_membership, encode_state_pair, VoteState};
use crate::state::GroupState;
use crate::types::{LogId, NodeId, Vote};

/// Entries written per append call while bootstrapping (the log is fsynced once, on close).
const ENTRIES_PER_APPEND: usize = 256;

/// Writes a single-replica group for `node` into the empty directory `dir` (see the module
/// docs). `first_kafka`: the Kafka offset of the first record. `table`: the group is a table
/// group. Returns the number of payload entries.
pub fn write_single_replica_group(
    fs: Arc<dyn Fs>,
    dir: &Path,
    node: NodeId,
    log: LogConfig,
    first_kafka: i64,
    table: bool,
    payloads: impl IntoIterator<Item = Payload>,
) -> io::Result<u64> {
    let (log, report) = Log::open(fs.clone(), dir, log).map_err(io::Error::other)?;
    if report.next_index != 0 {
        return Err(io::Error::other(format!(
            "{} already holds a log; a group is only written into an empty directory",
            dir.display()
        )));
    }
    if first_kafka < 0 {
        return Err(io::Error::other(format!(
            "first Kafka offset {first_kafka} is negative"
        )));
    }
    if first_kafka > 0 {
        log.reset(0, first_kafka, 0).map_err(io::Error::other)?;
    }
    let membership = Membership::new(vec![BTreeSet::from([node])], BTreeSet::from([node]));
    let mut m = Vec::new();
    encode_membership(&membership, &mut m);
    let now = crate::log_store::now_ms();
    log.append(
        &mut [
            NewEntry {
                index: 0,
                term: 0,
                body: EntryBody::Control(ControlKind::Membership, Bytes::from(m)),
            },
            NewEntry {
                index: 1,
                term: 1,
                body: EntryBody::Control(ControlKind::Blank, Bytes::new()),
            },
        ],
        now,
    )
    .map_err(io::Error::other)?;
    let mut index = 2u64;
    let mut written = 0u64;
    let mut chunk: Vec<(u64, Payload)> = Vec::with_capacity(ENTRIES_PER_APPEND);
    let flush = |chunk: &mut Vec<(u64, Payload)>| -> io::Result<()> {
        let mut entries: Vec<NewEntry> = chunk
            .drain(..)
            .map(|(index, p)| NewEntry {
                index,
                term: 1,
                body: match p {
                    Payload::Records { batches, .. } | Payload::WrittenAhead { batches, .. } => {
                        EntryBody::Records(batches)
                    }
                    Payload::Command(c) => {
                        EntryBody::Control(ControlKind::Command, Bytes::from(c.encode()))
                    }
                    Payload::Summary { .. } => EntryBody::Records(Bytes::new()),
                },
            })
            .collect();
        log.append(&mut entries, now).map_err(io::Error::other)?;
        Ok(())
    };
    for p in payloads {
        if matches!(p, Payload::Summary { .. }) {
            return Err(io::Error::other("a summary payload cannot be written"));
        }
        chunk.push((index, p));
        index += 1;
        written += 1;
        if chunk.len() == ENTRIES_PER_APPEND {
            flush(&mut chunk)?;
        }
    }
    if !chunk.is_empty() {
        flush(&mut chunk)?;
    }
    log.close().map_err(io::Error::other)?;
    let vote = encode_state_pair(&VoteState {
        vote: Some(Vote::new_committed(1, node)),
        guard: Default::default(),
    });
    fs::write_all_new(fs.as_ref(), &dir.join(VOTE_FILE), &vote)?;
    let last = LogId::new(CommittedLeaderId::new(1, 0), index - 1);
    let state = GroupState {
        applied: (!table).then_some(last),
        log_start: None,
        membership: StoredMembership::new(
            Some(LogId::new(CommittedLeaderId::new(0, 0), 0)),
            membership,
        ),
        table: None,
        records_start: 0,
    };
    state.save(fs.as_ref(), dir)?;
    Ok(written)
}

mod fs {
    use std::io;
    use std::path::Path;

    use kiln_log::fs::Fs;

    /// Writes a new file durably (its directory entry too).
    pub(super) fn write_all_new(fs: &dyn Fs, path: &Path, bytes: &[u8]) -> io::Result<()> {
        kiln_log::fs::write_atomic(fs, path, bytes)
    }
}
