//! A per-partition tracker of in-flight offsets. An agent works on several messages of one
//! partition at once and they finish in any order; Kafka keeps one committed offset per
//! partition, meaning "everything below this is done". [`Watermark::committable`] is that
//! offset: the lowest unfinished offset, or one past the highest seen when none is
//! unfinished. It never moves backwards and never passes an unfinished offset, so a crash
//! after a commit never skips a node that was still being burnt in.
//!
//! Offsets need not be contiguous (compaction, transaction markers): an offset the consumer
//! never saw below an unfinished one is simply not there.

use std::collections::BTreeSet;

#[derive(Debug, Clone, Default)]
pub struct Watermark {
    /// Started and not finished.
    unfinished: BTreeSet<i64>,
    /// One past the highest offset started; `None` before the first.
    next: Option<i64>,
    /// The highest offset returned by `committable` so far (monotonic).
    committed: Option<i64>,
}

impl Watermark {
    pub fn new() -> Watermark {
        Watermark::default()
    }

    /// A message at `offset` was received and work on it begins. Offsets arrive in order;
    /// an offset at or below one already started (a redelivery after a seek) is ignored.
    pub fn start(&mut self, offset: i64) -> bool {
        if self.next.is_some_and(|n| offset < n) {
            return false;
        }
        self.unfinished.insert(offset);
        self.next = Some(offset + 1);
        // The first offset received is where the group's committed position already is.
        self.committed.get_or_insert(offset);
        true
    }

    /// Work on `offset` is done (its result is in the store). Returns the new committable
    /// offset when it moved forward.
    pub fn finish(&mut self, offset: i64) -> Option<i64> {
        if !self.unfinished.remove(&offset) {
            return None;
        }
        let c = self.committable()?;
        if self.committed.is_some_and(|old| c <= old) {
            return None;
        }
        self.committed = Some(c);
        Some(c)
    }

    /// The offset to commit: every offset below it that was started has finished.
    pub fn committable(&self) -> Option<i64> {
        match self.unfinished.first() {
            Some(&lowest) => Some(lowest),
            None => self.next,
        }
        .map(|c| c.max(self.committed.unwrap_or(i64::MIN)))
    }

    /// Offsets started and not finished.
    pub fn in_flight(&self) -> usize {
        self.unfinished.len()
    }

    pub fn is_unfinished(&self, offset: i64) -> bool {
        self.unfinished.contains(&offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn out_of_order_completion_commits_only_the_contiguous_prefix() {
        let mut w = Watermark::new();
        for o in 10..15 {
            assert!(w.start(o));
        }
        assert_eq!(w.committable(), Some(10));
        assert_eq!(w.finish(12), None);
        assert_eq!(w.finish(11), None);
        assert_eq!(w.finish(10), Some(13));
        assert_eq!(w.finish(10), None, "finishing twice changes nothing");
        assert_eq!(w.finish(14), None);
        assert_eq!(w.finish(13), Some(15));
        assert_eq!(w.in_flight(), 0);
        assert!(!w.start(14), "an offset below the next is a redelivery");
        assert!(w.start(20), "gaps are allowed");
        assert_eq!(w.committable(), Some(20));
        assert_eq!(w.finish(20), Some(21));
    }

    proptest! {
        /// Random arrivals (with gaps) interleaved with random completions: the committed
        /// offset never passes an unfinished offset and never moves backwards, and once all
        /// are done it is one past the last.
        #[test]
        fn never_passes_unfinished_never_backwards(
            gaps in prop::collection::vec(1i64..4, 1..60),
            picks in prop::collection::vec(any::<usize>(), 0..200),
            interleave in prop::collection::vec(any::<bool>(), 0..200),
        ) {
            let mut offsets = Vec::new();
            let mut o = 0i64;
            for g in &gaps { o += g; offsets.push(o); }
            let mut w = Watermark::new();
            let mut started = 0usize;
            let mut open: Vec<i64> = Vec::new();
            let mut last_commit: Option<i64> = None;
            let step = |w: &mut Watermark, open: &mut Vec<i64>, pick: usize, last: &mut Option<i64>| {
                if open.is_empty() { return; }
                let off = open.swap_remove(pick % open.len());
                if let Some(c) = w.finish(off) {
                    if let Some(l) = *last { assert!(c > l, "moved backwards: {l} -> {c}"); }
                    for u in open.iter() { assert!(c <= *u, "commit {c} passes unfinished {u}"); }
                    *last = Some(c);
                }
            };
            for (i, idx) in picks.iter().enumerate() {
                let start_now = interleave.get(i).copied().unwrap_or(false);
                if start_now && started < offsets.len() {
                    prop_assert!(w.start(offsets[started]));
                    open.push(offsets[started]);
                    started += 1;
                } else {
                    step(&mut w, &mut open, *idx, &mut last_commit);
                }
            }
            while started < offsets.len() { w.start(offsets[started]); open.push(offsets[started]); started += 1; }
            while !open.is_empty() { step(&mut w, &mut open, 0, &mut last_commit); }
            prop_assert_eq!(w.committable(), Some(o + 1));
            prop_assert_eq!(last_commit, Some(o + 1));
        }
    }
}
