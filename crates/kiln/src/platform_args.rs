//! The store and queue flags the platform tools (intake register, nodes, dlq, status) share.

use clap::Args;

/// `Debug` shows the URL without its password.
#[derive(Args)]
pub struct StoreArgs {
    /// Results store: sqlite://PATH (embedded, a file) or postgres://USER[:PASSWORD]@HOST:PORT/DB.
    // The URL may hold a password: --help names the variable but never shows its value.
    #[arg(
        long,
        global = true,
        env = "KILN_DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://kiln.db"
    )]
    pub database_url: String,
}

impl std::fmt::Debug for StoreArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreArgs")
            .field("database_url", &kiln_store::redact_url(&self.database_url))
            .finish()
    }
}

#[derive(Args, Debug)]
pub struct PlatformArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Kafka bootstrap servers: Kiln's broker, Apache Kafka or Redpanda (host:port[,host:port]).
    #[arg(
        long,
        global = true,
        env = "KILN_BOOTSTRAP",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap: String,
}
