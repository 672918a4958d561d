//! The `--bootstrap` and `--timeout-s` flags every admin command shares.

use std::time::Duration;

use clap::Args;

#[derive(Args, Debug)]
pub struct BrokerAddress {
    /// Broker to talk to.
    #[arg(
        long,
        global = true,
        env = "KILN_BOOTSTRAP",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap: String,
    /// How long to wait for the broker, in seconds.
    #[arg(long, global = true, default_value_t = 10)]
    pub timeout_s: u64,
}

impl BrokerAddress {
    /// The wait for any one broker exchange (at least one second).
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s.max(1))
    }
}
