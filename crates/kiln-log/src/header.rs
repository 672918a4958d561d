//! The segment header: the first [`HEADER_LEN`] bytes of every `<index>.log` file.
//!
//! It says where the segment starts and how much of it is known to be on disk, so that recovery
//! can tell a torn tail (written, never synced, so never acknowledged: cut it) from lost synced
//! data (damage: the replica may have acknowledged it, so it must be repaired before it votes).
//!
//! Two slots of [`SLOT_LEN`] bytes, at 0 and [`SLOT_B_AT`] (separate sectors), written in turn;
//! recovery takes the valid slot with the higher sequence number, so a torn slot write leaves the
//! other, older and still true, slot. Slot layout (big-endian):
//!
//! | at | field | meaning |
//! |---|---|---|
//! | 0 | magic `KLNSEG\0\x01` | format version 1 |
//! | 8 | seq u64 | increases with every write of a slot |
//! | 16 | base_index u64 | Raft index of the segment's first entry |
//! | 24 | base_kafka i64 | Kafka offset of the segment's first data record |
//! | 32 | prev_term u64 | term of the entry before `base_index` (0: none) |
//! | 40 | synced_len u64 | bytes (from the file start, whole entries) known fsynced |
//! | 48 | synced_next_index u64 | the index after the last entry within `synced_len` |
//! | 56 | synced_next_kafka i64 | the Kafka offset after it |
//! | 64 | synced_last_term u64 | the term of that last entry (`prev_term` if none) |
//! | 72 | checkpoint_len u64 | data and index files below this are trusted without a scan |
//! | 80 | checkpoint_next_index u64 | as `synced_*`, at `checkpoint_len` |
//! | 88 | checkpoint_next_kafka i64 | |
//! | 96 | checkpoint_last_term u64 | |
//! | 104 | checkpoint_max_ts i64 | largest data batch timestamp below `checkpoint_len` |
//! | 112 | flags u32 | bit 0: sealed (a closed segment, wholly synced: `synced_len` is its length); bit 1: restart (made by `Log::reset`: the log starts over here) |
//! | 116 | reserved u32 (0) | |
//! | 120 | crc u32 | CRC32C of bytes 0..120 |
//! | 124 | reserved u32 (0) | |
//!
//! A slot only ever claims what an fsync that already returned made durable: the claim for a
//! sync is written with the *next* write of the file (docs/storage.md, "Torn or lost").

pub const HEADER_LEN: u64 = 4096;
pub const SLOT_LEN: usize = 128;
pub const SLOT_B_AT: u64 = 512;
const MAGIC: &[u8; 8] = b"KLNSEG\x00\x01";
const CRC_AT: usize = 120;
const FLAG_SEALED: u32 = 1;
const FLAG_RESTART: u32 = 2;

/// A position in the log: byte length of the segment file and the entry that starts there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mark {
    pub len: u64,
    pub next_index: u64,
    pub next_kafka: i64,
    /// Term of the last entry before `len` (the segment's `prev_term` when none).
    pub last_term: u64,
}

/// One header slot (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub seq: u64,
    pub base_index: u64,
    pub base_kafka: i64,
    pub prev_term: u64,
    pub synced: Mark,
    pub checkpoint: Mark,
    pub checkpoint_max_ts: i64,
    pub sealed: bool,
    /// The segment starts the log over ([`crate::Log::reset`]): older segments before a gap
    /// are what the reset left behind. Without it a gap is lost data, never a reason to drop
    /// what comes before.
    pub restart: bool,
}

impl Slot {
    /// The slot of a new, empty segment.
    pub fn new(base_index: u64, base_kafka: i64, prev_term: u64, restart: bool) -> Slot {
        let empty = Mark {
            len: HEADER_LEN,
            next_index: base_index,
            next_kafka: base_kafka,
            last_term: prev_term,
        };
        Slot {
            seq: 0,
            base_index,
            base_kafka,
            prev_term,
            synced: empty,
            checkpoint: empty,
            checkpoint_max_ts: i64::MIN,
            sealed: false,
            restart,
        }
    }

    pub fn encode(&self) -> [u8; SLOT_LEN] {
        debug_assert!(
            self.checkpoint.len <= self.synced.len,
            "checkpoint past synced"
        );
        debug_assert!(
            self.synced.len >= HEADER_LEN,
            "synced before the data start"
        );
        let mut b = [0u8; SLOT_LEN];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            b[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(MAGIC);
        put(&self.seq.to_be_bytes());
        put(&self.base_index.to_be_bytes());
        put(&self.base_kafka.to_be_bytes());
        put(&self.prev_term.to_be_bytes());
        for m in [self.synced, self.checkpoint] {
            put(&m.len.to_be_bytes());
            put(&m.next_index.to_be_bytes());
            put(&m.next_kafka.to_be_bytes());
            put(&m.last_term.to_be_bytes());
        }
        put(&self.checkpoint_max_ts.to_be_bytes());
        let flags =
            if self.sealed { FLAG_SEALED } else { 0 } | if self.restart { FLAG_RESTART } else { 0 };
        put(&flags.to_be_bytes());
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Decodes a slot; `None` for a torn, zeroed or damaged one.
    pub fn decode(b: &[u8]) -> Option<Slot> {
        let b = b.get(..SLOT_LEN)?;
        if b.get(..8)? != MAGIC {
            return None;
        }
        let stored = u32::from_be_bytes(b.get(CRC_AT..CRC_AT + 4)?.try_into().ok()?);
        if stored != crc32c::crc32c(b.get(..CRC_AT)?) {
            return None;
        }
        let u = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        let mark = |at: usize| -> Option<Mark> {
            Some(Mark {
                len: u(at)?,
                next_index: u(at + 8)?,
                next_kafka: u(at + 16)? as i64,
                last_term: u(at + 24)?,
            })
        };
        let flags = u32::from_be_bytes(b.get(112..116)?.try_into().ok()?);
        let slot = Slot {
            seq: u(8)?,
            base_index: u(16)?,
            base_kafka: u(24)? as i64,
            prev_term: u(32)?,
            synced: mark(40)?,
            checkpoint: mark(72)?,
            checkpoint_max_ts: u(104)? as i64,
            sealed: flags & FLAG_SEALED != 0,
            restart: flags & FLAG_RESTART != 0,
        };
        // A slot whose claims contradict each other is as good as damaged.
        let sane = slot.synced.len >= HEADER_LEN
            && slot.checkpoint.len >= HEADER_LEN
            && slot.checkpoint.len <= slot.synced.len
            && slot.checkpoint.next_index <= slot.synced.next_index
            && slot.synced.next_index >= slot.base_index
            && slot.checkpoint.next_index >= slot.base_index;
        sane.then_some(slot)
    }

    /// Where this slot is written: the two slots take turns.
    pub fn position(&self) -> u64 {
        if self.seq.is_multiple_of(2) {
            0
        } else {
            SLOT_B_AT
        }
    }
}

/// The newer valid slot of a header (the first [`HEADER_LEN`] bytes of a segment file, or as
/// many as the file has), or `None` when neither slot is valid.
pub fn read_best(header: &[u8]) -> Option<Slot> {
    let a = header.get(..SLOT_LEN).and_then(Slot::decode);
    let b = header
        .get(SLOT_B_AT as usize..SLOT_B_AT as usize + SLOT_LEN)
        .and_then(Slot::decode);
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.seq > a.seq { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// A whole header for a new segment: both slots (sequence 0 and 1) say the same thing.
pub fn initial(base_index: u64, base_kafka: i64, prev_term: u64, restart: bool) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN as usize];
    let first = Slot::new(base_index, base_kafka, prev_term, restart);
    let second = Slot { seq: 1, ..first };
    out[..SLOT_LEN].copy_from_slice(&first.encode());
    out[SLOT_B_AT as usize..SLOT_B_AT as usize + SLOT_LEN].copy_from_slice(&second.encode());
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn slots_round_trip_and_the_newer_valid_one_wins() {
        let mut h = initial(10, 500, 3, false);
        let best = read_best(&h).unwrap();
        assert_eq!((best.seq, best.base_index, best.base_kafka), (1, 10, 500));
        let mut next = Slot {
            seq: 2,
            synced: Mark {
                len: 5000,
                next_index: 12,
                next_kafka: 520,
                last_term: 4,
            },
            ..best
        };
        next.checkpoint = next.synced;
        let at = next.position() as usize;
        assert_eq!(at, 0);
        h[at..at + SLOT_LEN].copy_from_slice(&next.encode());
        assert_eq!(read_best(&h).unwrap(), next);
        // A torn write of the newer slot: the older one stands.
        h[at + 50] ^= 1;
        assert_eq!(read_best(&h).unwrap().seq, 1);
        h[SLOT_B_AT as usize + 3] = 0;
        assert_eq!(read_best(&h), None);
        assert_eq!(read_best(&[]), None);
    }

    #[test]
    fn the_restart_flag_round_trips_beside_the_seal() {
        for (sealed, restart) in [(false, true), (true, true), (true, false)] {
            let slot = Slot {
                sealed,
                ..Slot::new(7, 70, 2, restart)
            };
            let back = Slot::decode(&slot.encode()).unwrap();
            assert_eq!((back.sealed, back.restart), (sealed, restart));
        }
        let h = initial(7, 70, 2, true);
        assert!(read_best(&h).unwrap().restart);
    }
}
