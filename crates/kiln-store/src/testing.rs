//! Helpers for tests in this and other crates that need a real database. Not for production.
//!
//! PostgreSQL tests read `KILN_TEST_POSTGRES_URL` (set by `scripts/test`, which starts a
//! throwaway server with `scripts/pg-test-server`). Without it they fail, loudly, unless
//! `KILN_ALLOW_NO_POSTGRES=1` says skipping them is intended.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

pub const POSTGRES_URL_ENV: &str = "KILN_TEST_POSTGRES_URL";
pub const ALLOW_NO_POSTGRES_ENV: &str = "KILN_ALLOW_NO_POSTGRES";

/// The server URL from the environment; `None` only when skipping was explicitly allowed.
///
/// # Panics
/// When the variable is unset and skipping was not allowed: a test that silently passed
/// without PostgreSQL would claim coverage it does not have.
pub fn postgres_server_url() -> Option<String> {
    match std::env::var(POSTGRES_URL_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var(ALLOW_NO_POSTGRES_ENV).as_deref() == Ok("1") => {
            eprintln!(
                "SKIPPED: PostgreSQL test ({POSTGRES_URL_ENV} unset, {ALLOW_NO_POSTGRES_ENV}=1)"
            );
            None
        }
        _ => panic!(
            "{POSTGRES_URL_ENV} is not set. These tests need a real PostgreSQL server: run \
             scripts/test (it starts one with scripts/pg-test-server and exports the URL), or \
             export {POSTGRES_URL_ENV}=$(scripts/pg-test-server). Set {ALLOW_NO_POSTGRES_ENV}=1 \
             only to skip them on purpose."
        ),
    }
}

/// Creates a fresh, empty database on the test server and returns its URL (each test gets
/// its own, so tests run in parallel without seeing each other's rows).
pub async fn fresh_postgres_database() -> Option<String> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let server = postgres_server_url()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "kiln_test_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        nanos
    );
    let opts = match PgConnectOptions::from_str(&server) {
        Ok(o) => o,
        Err(e) => panic!("{POSTGRES_URL_ENV}={server:?} is not a PostgreSQL URL: {e}"),
    };
    let mut conn = match opts.connect().await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to the test PostgreSQL at {server}: {e} (is scripts/pg-test-server running?)"),
    };
    if let Err(e) = sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
    {
        panic!("CREATE DATABASE {name} failed: {e}");
    }
    let _ = conn.close().await;
    let url = opts.database(&name).to_url_lossy();
    Some(url.to_string())
}

/// A plausible H100 node for tests and benchmarks: BMC `bmc-<host>:443`, 8 GPUs, fixed firmware
/// levels and one label (`row=3`). Callers change the fields their case is about.
pub fn sample_node(hostname: &str, rack: &str) -> kiln_manifest::NodeSpec {
    kiln_manifest::NodeSpec {
        hostname: hostname.into(),
        rack: rack.into(),
        bmc_address: format!("bmc-{hostname}:443"),
        gpu_model: "H100-SXM".into(),
        gpu_count: 8,
        firmware_bmc: "1.10".into(),
        firmware_bios: "2.3.1".into(),
        firmware_gpu_vbios: "96.00.74".into(),
        firmware_nic: "28.39".into(),
        labels: std::collections::BTreeMap::from([("row".to_string(), "3".to_string())]),
    }
}
