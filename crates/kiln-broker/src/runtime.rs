//! The multi-threaded tokio runtime a broker (and everything `kiln` runs) is built on.
//!
//! One setting differs from tokio's defaults: no LIFO slot. With the slot, a task woken by a
//! running task (the partition's proposer, woken by the connection that submitted a produce;
//! the Raft core, woken by the proposer) waits in that worker's slot, where no other worker may
//! take it, until the waking task yields; a connection with several requests buffered reads and
//! dispatches them all first, so a produce waited 136-174 us on average for its proposer to
//! run, most waits between 50 and 400 us. Without the slot the woken task goes to the worker's
//! queue and an idle worker is woken to take it. Measured with `kiln-bench produce` (defaults,
//! 2 cores): 1,367,681-1,418,303 records/s against 1,254,830-1,329,406 with the slot, p50 2.47-
//! 2.56 ms against 2.71-2.85 ms (docs/benchmarks.md). The setting is tokio's unstable API, hence
//! `--cfg tokio_unstable` in `.cargo/config.toml`; a build without that flag keeps the slot.

/// Whether this build's broker runtime runs without the LIFO slot.
pub const LIFO_SLOT_DISABLED: bool = cfg!(tokio_unstable);

/// A multi-threaded runtime builder with every driver enabled and no LIFO slot (when the build
/// allows it).
pub fn builder() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped build runs without the slot: this fails if `.cargo/config.toml` stops
    /// setting `--cfg tokio_unstable` (or RUSTFLAGS replace it), rather than losing the
    /// setting silently.
    #[test]
    // The constant is what is tested: it says how this build was configured.
    #[allow(clippy::assertions_on_constants)]
    fn this_build_runs_without_the_lifo_slot() {
        assert!(
            LIFO_SLOT_DISABLED,
            "built without --cfg tokio_unstable (.cargo/config.toml): the runtime keeps tokio's LIFO slot"
        );
        let runtime = builder().worker_threads(2).build().expect("a runtime");
        assert_eq!(runtime.block_on(async { 1 + 1 }), 2);
    }
}
