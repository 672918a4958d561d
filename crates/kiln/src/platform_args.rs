//! The store and queue flags the platform commands (intake, nodes, dlq) share.

use clap::Args;

#[derive(Args, Debug)]
pub struct StoreArgs {
    /// Results store: sqlite://PATH (embedded, a file) or postgres://USER[:PASSWORD]@HOST:PORT/DB.
    #[arg(
        long,
        global = true,
        env = "KILN_DATABASE_URL",
        default_value = "sqlite://kiln.db"
    )]
    pub database_url: String,
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
