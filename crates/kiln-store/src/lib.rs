//! Kiln's results store: racks, nodes (identity, manifest data, current state), burn-in runs
//! and their check results, in SQLite (embedded default: one file, no server) or PostgreSQL
//! (production), chosen by the database URL.
//!
//! One [`Store`] type over two concrete pools rather than sqlx's `Any` driver, so every query
//! is compiled against each backend's own types (JSONB and `FOR UPDATE` on PostgreSQL,
//! `BEGIN IMMEDIATE` on SQLite). The two schemas live in `migrations/sqlite` and
//! `migrations/postgres`, are embedded in the binary and applied by [`Store::connect`].
//!
//! The node state machine (DESIGN.md invariant 7: a node is always in exactly one of these and
//! ends passed or dead-lettered):
//!
//! ```text
//! (register) -> queued -> running -> passed
//!                  ^         |
//!                  |         +-> retrying (attempt < MAX_ATTEMPTS) -> running (attempt + 1) ...
//!                  |         +-> dead_lettered (attempt = MAX_ATTEMPTS)
//!                  +-- re-register after passed / dead_lettered: next cycle, attempt 1
//! ```
//!
//! Redelivery is harmless: runs are unique on (hostname, cycle, attempt); [`Store::begin_run`]
//! of a finished run says so instead of starting another, and [`Store::finish_run`] of a
//! finished run changes nothing.

pub mod testing;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use kiln_findings::{analyze, Analysis, AttemptInput, CheckInput, Finding, NodeInput, Outcome};
use kiln_manifest::NodeSpec;
use serde::{Deserialize, Serialize};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row};

/// Attempts a node gets in one cycle; a failed attempt `MAX_ATTEMPTS` dead-letters it.
pub const MAX_ATTEMPTS: u32 = 10;
/// Raw evidence longer than this is cut (with a note saying how much was cut).
pub const EVIDENCE_BYTES_MAX: usize = 1 << 20;
/// Rows per multi-row statement: under SQLite's 32766 and PostgreSQL's 65535 bound parameters.
const ROWS_PER_STATEMENT: usize = 500;

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../../migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../../migrations/postgres");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL {0:?}: use sqlite://PATH (or sqlite::memory:) or postgres://USER@HOST:PORT/DB")]
    UnsupportedUrl(String),
    #[error("the database {url}: {reason}")]
    Password { url: String, reason: &'static str },
    #[error(transparent)]
    PasswordFile(#[from] kiln_settings::SettingsError),
    #[error("cannot open the database {url}: {source}")]
    Connect { url: String, source: sqlx::Error },
    #[error("cannot apply migrations to {url}: {source}")]
    Migrate {
        url: String,
        source: sqlx::migrate::MigrateError,
    },
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("no burn-in run with id {0}")]
    UnknownRun(i64),
    #[error("the store holds a value this build does not understand: {0}")]
    Corrupt(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Where a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Queued,
    Running,
    Passed,
    Retrying,
    DeadLettered,
}

impl NodeState {
    pub const ALL: [NodeState; 5] = [
        NodeState::Queued,
        NodeState::Running,
        NodeState::Passed,
        NodeState::Retrying,
        NodeState::DeadLettered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Queued => "queued",
            NodeState::Running => "running",
            NodeState::Passed => "passed",
            NodeState::Retrying => "retrying",
            NodeState::DeadLettered => "dead_lettered",
        }
    }

    /// Queued, running or retrying: the node is on the queue or being burnt in, so registering
    /// it again must not queue it twice.
    pub fn in_progress(self) -> bool {
        matches!(
            self,
            NodeState::Queued | NodeState::Running | NodeState::Retrying
        )
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NodeState {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        NodeState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| StoreError::Corrupt(format!("node state {s:?}")))
    }
}

/// A run's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunVerdict {
    Pass,
    Fail,
}

impl RunVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            RunVerdict::Pass => "pass",
            RunVerdict::Fail => "fail",
        }
    }
    fn parse(s: &str) -> Result<Self> {
        match s {
            "pass" => Ok(RunVerdict::Pass),
            "fail" => Ok(RunVerdict::Fail),
            other => Err(StoreError::Corrupt(format!("run verdict {other:?}"))),
        }
    }
}

/// One check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckVerdict {
    Pass,
    Fail,
    Warn,
    Skip,
    Error,
}

impl CheckVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckVerdict::Pass => "pass",
            CheckVerdict::Fail => "fail",
            CheckVerdict::Warn => "warn",
            CheckVerdict::Skip => "skip",
            CheckVerdict::Error => "error",
        }
    }
    fn parse(s: &str) -> Result<Self> {
        [Self::Pass, Self::Fail, Self::Warn, Self::Skip, Self::Error]
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| StoreError::Corrupt(format!("check verdict {s:?}")))
    }
}

/// One check of a run: what was measured, what it means, and the raw evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub name: String,
    pub verdict: CheckVerdict,
    /// Measured values, e.g. `{"gpu_count": 7, "expected": 8}`.
    pub measured: serde_json::Value,
    pub message: String,
    /// Raw output (command output, Redfish JSON); cut at [`EVIDENCE_BYTES_MAX`].
    pub evidence: String,
    /// What the check found, one finding per component and fault (empty when it passed,
    /// and for results from before findings existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}

impl CheckResult {
    /// The check as the per-component analysis reads it.
    pub fn analysis_input(&self) -> CheckInput<'_> {
        CheckInput {
            name: &self.name,
            outcome: match self.verdict {
                CheckVerdict::Pass => Outcome::Pass,
                CheckVerdict::Fail => Outcome::Fail,
                CheckVerdict::Error => Outcome::Error,
                CheckVerdict::Warn | CheckVerdict::Skip => Outcome::Other,
            },
            message: &self.message,
            findings: &self.findings,
        }
    }
}

/// A node's registration for intake: its manifest data and the cycle it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedNode {
    pub spec: NodeSpec,
    pub cycle: u32,
}

/// Where a node stands (the part of its row intake needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub state: NodeState,
    pub cycle: u32,
    pub attempt: u32,
}

/// A node's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub spec: NodeSpec,
    pub state: NodeState,
    pub state_reason: String,
    pub cycle: u32,
    pub attempt: u32,
    pub registered_at_ms: i64,
    pub updated_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEvent {
    pub at_ms: i64,
    pub cycle: u32,
    pub attempt: u32,
    pub state: NodeState,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: i64,
    pub cycle: u32,
    pub attempt: u32,
    pub agent: String,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub verdict: Option<RunVerdict>,
    pub checks: Vec<CheckResult>,
}

/// Everything the store knows about a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeHistory {
    pub node: NodeRecord,
    pub events: Vec<NodeEvent>,
    pub runs: Vec<RunRecord>,
}

impl NodeHistory {
    /// The per-component analysis of `cycle`'s finished attempts (kiln-findings): what the
    /// dead-letter report, the dashboard and `kiln dlq` show.
    pub fn analysis(&self, cycle: u32) -> Analysis {
        let attempts: Vec<AttemptInput<'_>> = self
            .runs
            .iter()
            .filter(|r| r.cycle == cycle && r.verdict.is_some())
            .map(|r| AttemptInput {
                attempt: r.attempt,
                checks: r.checks.iter().map(CheckResult::analysis_input).collect(),
            })
            .collect();
        analyze(
            NodeInput {
                hostname: &self.node.spec.hostname,
                bmc_address: &self.node.spec.bmc_address,
            },
            &attempts,
        )
    }
}

/// What [`Store::begin_run`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginRun {
    /// A new run: go ahead.
    Started { run: i64 },
    /// A run for this attempt was begun (by `previous_agent`) and never finished, e.g. the
    /// agent died: this caller takes it over and runs the checks again.
    Resumed { run: i64, previous_agent: String },
    /// This attempt already finished (a redelivered message): do not run it again; repeat
    /// only what follows the result (re-enqueue or dead-letter, then commit).
    AlreadyFinished {
        run: i64,
        verdict: RunVerdict,
        state: NodeState,
    },
    /// The message is older than what the store knows (an earlier cycle or attempt): skip it.
    Stale { current: NodeStatus },
}

/// How [`Store::finish_run_with`] moves the node on besides its verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinishOptions {
    /// Dead-letter the node after this failed run, whatever its attempt, and why (a fault no
    /// retry fixes: an RMA candidate, the same fault on the same part twice).
    pub dead_letter_now: Option<String>,
}

/// What [`Store::finish_run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishRun {
    /// The node's state after this run: passed, retrying or dead_lettered.
    pub state: NodeState,
    /// True when the run had already been finished (nothing was written this time).
    pub already_finished: bool,
}

/// Which database a store is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The results store. Cheap to clone (pools are reference-counted).
#[derive(Clone, Debug)]
pub enum Store {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs `$body` once per backend with `$pool` bound to the concrete pool, `Db` to the sqlx
/// database type and `PG` to whether it is PostgreSQL, so each query is type-checked against
/// each backend.
macro_rules! on_backend {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            Store::Sqlite($pool) => {
                #[allow(dead_code)]
                type Db = sqlx::Sqlite;
                #[allow(dead_code)]
                const PG: bool = false;
                $body
            }
            Store::Postgres($pool) => {
                #[allow(dead_code)]
                type Db = sqlx::Postgres;
                #[allow(dead_code)]
                const PG: bool = true;
                $body
            }
        }
    };
}

/// Begins a transaction that will write: `BEGIN IMMEDIATE` on SQLite takes the write lock
/// up front, so a read-then-write transaction cannot fail on lock upgrade.
macro_rules! begin_write {
    ($pool:ident) => {
        if PG {
            $pool.begin().await?
        } else {
            $pool.begin_with("BEGIN IMMEDIATE").await?
        }
    };
}

// Declared after the macros above, which it uses.
pub mod dashboard;
pub mod triage;

/// Hides the passwords in a database URL for messages: the one in its user info
/// (`postgres://kiln:***@db/kiln`) and any `password=` or `sslpassword=` query parameter.
pub fn redact_url(url: &str) -> String {
    // The user info ends at the last `@` before the query: a password may hold `/` unescaped,
    // a query value `@`.
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut shown = match head.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
                None => head.to_string(),
            },
            None => head.to_string(),
        },
        None => head.to_string(),
    };
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _))
                    if key.eq_ignore_ascii_case("password")
                        || key.eq_ignore_ascii_case("sslpassword") =>
                {
                    format!("{key}=***")
                }
                _ => param.to_string(),
            })
            .collect();
        shown.push('?');
        shown.push_str(&params.join("&"));
    }
    shown
}

fn u32_of(v: i64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} = {v}")))
}

fn cut_evidence(s: &str) -> String {
    if s.len() <= EVIDENCE_BYTES_MAX {
        return s.to_string();
    }
    let mut end = EVIDENCE_BYTES_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[... {} bytes cut by kiln-store]",
        &s[..end],
        s.len() - end
    )
}

const NODE_COLUMNS: &str = "hostname, rack, bmc_address, gpu_model, gpu_count, firmware_bmc, \
    firmware_bios, firmware_gpu_vbios, firmware_nic, labels, state, state_reason, cycle, attempt, \
    registered_at_ms, updated_at_ms";

impl Store {
    /// Opens (creating a SQLite file if needed) and migrates the store at `url`:
    /// `sqlite://PATH`, `sqlite:PATH`, `sqlite::memory:`, `postgres://...` or `postgresql://...`.
    pub async fn connect(url: &str) -> Result<Store> {
        Store::connect_with_password(url, None).await
    }

    /// [`Store::connect_with_password`] with the password from the first line of `file`, when
    /// a service's settings name one (`database_password_file`).
    pub async fn connect_with_password_file(url: &str, file: Option<&Path>) -> Result<Store> {
        let password = file
            .map(|file| kiln_settings::read_secret_file("database_password_file", file))
            .transpose()?;
        Store::connect_with_password(url, password.as_deref()).await
    }

    /// [`Store::connect`] with PostgreSQL's password given apart from the URL, so that it can
    /// come from a file (a service's `database_password_file`) while the URL sits in a
    /// settings file or the environment. Refused for SQLite, which has none, and for a URL
    /// that holds a password of its own: two sources for one secret is a mistake.
    pub async fn connect_with_password(url: &str, password: Option<&str>) -> Result<Store> {
        let shown = redact_url(url);
        if password.is_some() {
            let refuse = |reason| {
                Err(StoreError::Password {
                    url: shown.clone(),
                    reason,
                })
            };
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return refuse("a password is given, but only a PostgreSQL store takes one");
            }
            // What redaction would hide is a password: in the user info or the query.
            if shown != url {
                return refuse("the URL holds a password and one is given apart: keep one");
            }
        }
        let connect_err = |source| StoreError::Connect {
            url: shown.clone(),
            source,
        };
        if url.starts_with("sqlite:") {
            let opts = SqliteConnectOptions::from_str(url)
                .map_err(connect_err)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // FULL: a committed result survives power loss, not just a process crash.
                .synchronous(SqliteSynchronous::Full)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(10));
            // One connection: SQLite has one writer at a time anyway, and a single connection
            // also makes `sqlite::memory:` one database rather than one per connection.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(opts)
                .await
                .map_err(connect_err)?;
            SQLITE_MIGRATIONS
                .run(&pool)
                .await
                .map_err(|source| StoreError::Migrate {
                    url: shown.clone(),
                    source,
                })?;
            Ok(Store::Sqlite(pool))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut opts = PgConnectOptions::from_str(url).map_err(connect_err)?;
            if let Some(password) = password {
                opts = opts.password(password);
            }
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(opts)
                .await
                .map_err(connect_err)?;
            POSTGRES_MIGRATIONS
                .run(&pool)
                .await
                .map_err(|source| StoreError::Migrate {
                    url: shown.clone(),
                    source,
                })?;
            Ok(Store::Postgres(pool))
        } else {
            Err(StoreError::UnsupportedUrl(shown))
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Store::Sqlite(_) => Backend::Sqlite,
            Store::Postgres(_) => Backend::Postgres,
        }
    }

    pub async fn close(&self) {
        on_backend!(self, pool => pool.close().await)
    }

    /// A trivial query: the database answers.
    pub async fn ping(&self) -> Result<()> {
        on_backend!(self, pool => {
            sqlx::query("SELECT 1").execute(pool).await?;
        });
        Ok(())
    }

    /// The status of each of `hostnames` the store knows (absent ones are left out).
    pub async fn node_states(&self, hostnames: &[&str]) -> Result<HashMap<String, NodeStatus>> {
        let mut out = HashMap::with_capacity(hostnames.len());
        for chunk in hostnames.chunks(ROWS_PER_STATEMENT) {
            on_backend!(self, pool => {
                let mut qb = QueryBuilder::<Db>::new(
                    "SELECT hostname, state, cycle, attempt FROM nodes WHERE hostname IN (",
                );
                let mut list = qb.separated(", ");
                for h in chunk {
                    list.push_bind(*h);
                }
                list.push_unseparated(")");
                for row in qb.build().fetch_all(pool).await? {
                    let hostname: String = row.try_get("hostname")?;
                    let state: String = row.try_get("state")?;
                    let status = NodeStatus {
                        state: state.parse()?,
                        cycle: u32_of(row.try_get("cycle")?, "cycle")?,
                        attempt: u32_of(row.try_get("attempt")?, "attempt")?,
                    };
                    out.insert(hostname, status);
                }
            });
        }
        Ok(out)
    }

    /// Records `nodes` as queued (their racks too), all in one transaction. A node already in
    /// the store is updated only when `cycle` is newer than the stored one, so a record that
    /// arrives after an agent already began the same cycle changes nothing. Returns how many
    /// nodes were written.
    pub async fn record_queued(&self, nodes: &[QueuedNode], now_ms: i64) -> Result<usize> {
        if nodes.is_empty() {
            return Ok(0);
        }
        let mut racks: Vec<&str> = nodes.iter().map(|n| n.spec.rack.as_str()).collect();
        racks.sort_unstable();
        racks.dedup();
        let mut written = 0usize;
        on_backend!(self, pool => {
            let mut tx = begin_write!(pool);
            for chunk in racks.chunks(ROWS_PER_STATEMENT) {
                let mut qb = QueryBuilder::<Db>::new("INSERT INTO racks (name, created_at_ms) ");
                qb.push_values(chunk, |mut b, rack| {
                    b.push_bind(*rack).push_bind(now_ms);
                });
                qb.push(" ON CONFLICT (name) DO NOTHING");
                qb.build().execute(&mut *tx).await?;
            }
            for chunk in nodes.chunks(ROWS_PER_STATEMENT) {
                let mut qb = QueryBuilder::<Db>::new(format!("INSERT INTO nodes ({NODE_COLUMNS}) "));
                qb.push_values(chunk, |mut b, n| {
                    let s = &n.spec;
                    b.push_bind(s.hostname.as_str())
                        .push_bind(s.rack.as_str())
                        .push_bind(s.bmc_address.as_str())
                        .push_bind(s.gpu_model.as_str())
                        .push_bind(i64::from(s.gpu_count))
                        .push_bind(s.firmware_bmc.as_str())
                        .push_bind(s.firmware_bios.as_str())
                        .push_bind(s.firmware_gpu_vbios.as_str())
                        .push_bind(s.firmware_nic.as_str())
                        .push_bind(labels_json(s));
                    if PG {
                        b.push_unseparated("::jsonb");
                    }
                    b.push_bind(NodeState::Queued.as_str())
                        .push_bind("registered")
                        .push_bind(i64::from(n.cycle))
                        .push_bind(1i64)
                        .push_bind(now_ms)
                        .push_bind(now_ms);
                });
                qb.push(
                    " ON CONFLICT (hostname) DO UPDATE SET rack = excluded.rack, \
                     bmc_address = excluded.bmc_address, gpu_model = excluded.gpu_model, \
                     gpu_count = excluded.gpu_count, firmware_bmc = excluded.firmware_bmc, \
                     firmware_bios = excluded.firmware_bios, \
                     firmware_gpu_vbios = excluded.firmware_gpu_vbios, \
                     firmware_nic = excluded.firmware_nic, labels = excluded.labels, \
                     state = excluded.state, state_reason = 're-registered', \
                     cycle = excluded.cycle, attempt = 1, updated_at_ms = excluded.updated_at_ms \
                     WHERE nodes.cycle < excluded.cycle \
                     RETURNING hostname, cycle",
                );
                let rows = qb.build().fetch_all(&mut *tx).await?;
                written += rows.len();
                let mut events = Vec::with_capacity(rows.len());
                for row in &rows {
                    events.push((row.try_get::<String, _>("hostname")?, row.try_get::<i64, _>("cycle")?));
                }
                if !events.is_empty() {
                    let mut qb = QueryBuilder::<Db>::new(
                        "INSERT INTO node_events (hostname, at_ms, cycle, attempt, state, reason) ",
                    );
                    qb.push_values(&events, |mut b, (hostname, cycle)| {
                        b.push_bind(hostname.as_str())
                            .push_bind(now_ms)
                            .push_bind(*cycle)
                            .push_bind(1i64)
                            .push_bind(NodeState::Queued.as_str())
                            .push_bind("registered by intake");
                    });
                    qb.build().execute(&mut *tx).await?;
                }
            }
            tx.commit().await?;
        });
        Ok(written)
    }

    /// An agent starts attempt `attempt` of cycle `cycle` on `node` (the data its message
    /// carries). One transaction. Idempotent on (hostname, cycle, attempt): see [`BeginRun`].
    /// When intake died after producing but before recording, the node is created here from
    /// the message, so it never goes unrecorded.
    pub async fn begin_run(
        &self,
        node: &NodeSpec,
        cycle: u32,
        attempt: u32,
        agent: &str,
        now_ms: i64,
    ) -> Result<BeginRun> {
        let (cycle_i, attempt_i) = (i64::from(cycle), i64::from(attempt));
        on_backend!(self, pool => {
            let mut tx = begin_write!(pool);
            let lock = if PG { " FOR UPDATE" } else { "" };
            let current = sqlx::query(&format!(
                "SELECT state, cycle, attempt FROM nodes WHERE hostname = $1{lock}"
            ))
            .bind(node.hostname.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            let current = match current {
                None => None,
                Some(row) => {
                    let state: String = row.try_get("state")?;
                    Some(NodeStatus {
                        state: state.parse()?,
                        cycle: u32_of(row.try_get("cycle")?, "cycle")?,
                        attempt: u32_of(row.try_get("attempt")?, "attempt")?,
                    })
                }
            };
            if let Some(cur) = current {
                if (cur.cycle, cur.attempt) > (cycle, attempt) {
                    // Only a finished run of this very attempt is not stale news.
                    let done = sqlx::query(
                        "SELECT id, verdict FROM runs WHERE hostname = $1 AND cycle = $2 AND attempt = $3",
                    )
                    .bind(node.hostname.as_str())
                    .bind(cycle_i)
                    .bind(attempt_i)
                    .fetch_optional(&mut *tx)
                    .await?;
                    tx.rollback().await?;
                    if let Some(row) = done {
                        if let Some(v) = row.try_get::<Option<String>, _>("verdict")? {
                            let verdict = RunVerdict::parse(&v)?;
                            return Ok(BeginRun::AlreadyFinished {
                                run: row.try_get("id")?,
                                verdict,
                                state: state_after(verdict, attempt),
                            });
                        }
                    }
                    return Ok(BeginRun::Stale { current: cur });
                }
            }
            if current.is_none_or(|cur| cur.cycle < cycle) {
                // Unknown node, or a newer cycle than recorded: take the message's data.
                sqlx::query("INSERT INTO racks (name, created_at_ms) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
                    .bind(node.rack.as_str())
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await?;
                let labels_param = if PG { "$10::jsonb" } else { "$10" };
                sqlx::query(&format!(
                    "INSERT INTO nodes ({NODE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, \
                     {labels_param}, 'queued', 'recorded from its queue message', $11, $12, $13, $13) \
                     ON CONFLICT (hostname) DO UPDATE SET rack = excluded.rack, \
                     bmc_address = excluded.bmc_address, gpu_model = excluded.gpu_model, \
                     gpu_count = excluded.gpu_count, firmware_bmc = excluded.firmware_bmc, \
                     firmware_bios = excluded.firmware_bios, firmware_gpu_vbios = excluded.firmware_gpu_vbios, \
                     firmware_nic = excluded.firmware_nic, labels = excluded.labels, \
                     cycle = excluded.cycle, attempt = excluded.attempt, updated_at_ms = excluded.updated_at_ms"
                ))
                .bind(node.hostname.as_str())
                .bind(node.rack.as_str())
                .bind(node.bmc_address.as_str())
                .bind(node.gpu_model.as_str())
                .bind(i64::from(node.gpu_count))
                .bind(node.firmware_bmc.as_str())
                .bind(node.firmware_bios.as_str())
                .bind(node.firmware_gpu_vbios.as_str())
                .bind(node.firmware_nic.as_str())
                .bind(labels_json(node))
                .bind(cycle_i)
                .bind(attempt_i)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            }

            let existing = sqlx::query(
                "SELECT id, agent, verdict FROM runs WHERE hostname = $1 AND cycle = $2 AND attempt = $3",
            )
            .bind(node.hostname.as_str())
            .bind(cycle_i)
            .bind(attempt_i)
            .fetch_optional(&mut *tx)
            .await?;
            let outcome = match existing {
                Some(row) => {
                    let run: i64 = row.try_get("id")?;
                    if let Some(v) = row.try_get::<Option<String>, _>("verdict")? {
                        let verdict = RunVerdict::parse(&v)?;
                        tx.rollback().await?;
                        return Ok(BeginRun::AlreadyFinished { run, verdict, state: state_after(verdict, attempt) });
                    }
                    let previous_agent: String = row.try_get("agent")?;
                    sqlx::query("UPDATE runs SET agent = $1, started_at_ms = $2 WHERE id = $3")
                        .bind(agent)
                        .bind(now_ms)
                        .bind(run)
                        .execute(&mut *tx)
                        .await?;
                    BeginRun::Resumed { run, previous_agent }
                }
                None => {
                    let row = sqlx::query(
                        "INSERT INTO runs (hostname, cycle, attempt, agent, started_at_ms) \
                         VALUES ($1, $2, $3, $4, $5) RETURNING id",
                    )
                    .bind(node.hostname.as_str())
                    .bind(cycle_i)
                    .bind(attempt_i)
                    .bind(agent)
                    .bind(now_ms)
                    .fetch_one(&mut *tx)
                    .await?;
                    BeginRun::Started { run: row.try_get("id")? }
                }
            };
            let reason = format!("attempt {attempt} started by agent {agent}");
            set_state(&mut tx, &node.hostname, NodeState::Running, &reason, cycle_i, attempt_i, now_ms).await?;
            tx.commit().await?;
            Ok(outcome)
        })
    }

    /// Finishes run `run` with `verdict` and its check results, and moves the node on
    /// (passed; retrying while attempts remain; dead_lettered after [`MAX_ATTEMPTS`]): all in
    /// one transaction, so a result is in the store before the agent commits its offset.
    /// Finishing a finished run writes nothing and reports the state it led to.
    pub async fn finish_run(
        &self,
        run: i64,
        verdict: RunVerdict,
        checks: &[CheckResult],
        now_ms: i64,
    ) -> Result<FinishRun> {
        self.finish_run_with(run, verdict, checks, now_ms, &FinishOptions::default())
            .await
    }

    /// [`Store::finish_run`], where a failed run may dead-letter the node before its last
    /// attempt (`options.dead_letter_now`; the reason goes into the node's state reason).
    pub async fn finish_run_with(
        &self,
        run: i64,
        verdict: RunVerdict,
        checks: &[CheckResult],
        now_ms: i64,
        options: &FinishOptions,
    ) -> Result<FinishRun> {
        on_backend!(self, pool => {
            let mut tx = begin_write!(pool);
            let lock = if PG { " FOR UPDATE" } else { "" };
            let row = sqlx::query(&format!(
                "SELECT hostname, cycle, attempt, verdict FROM runs WHERE id = $1{lock}"
            ))
            .bind(run)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::UnknownRun(run))?;
            let hostname: String = row.try_get("hostname")?;
            let cycle: i64 = row.try_get("cycle")?;
            let attempt = u32_of(row.try_get("attempt")?, "attempt")?;
            if let Some(earlier) = row.try_get::<Option<String>, _>("verdict")? {
                tx.rollback().await?;
                let earlier = RunVerdict::parse(&earlier)?;
                // The node row says where that run led (dead-lettered early or not).
                let current: String = sqlx::query("SELECT state FROM nodes WHERE hostname = $1")
                    .bind(hostname.as_str())
                    .fetch_one(pool)
                    .await?
                    .try_get("state")?;
                let state = match current.parse::<NodeState>()? {
                    NodeState::DeadLettered if earlier == RunVerdict::Fail => NodeState::DeadLettered,
                    _ => state_after(earlier, attempt),
                };
                return Ok(FinishRun { state, already_finished: true });
            }
            for chunk in checks.chunks(ROWS_PER_STATEMENT) {
                let mut qb = QueryBuilder::<Db>::new(
                    "INSERT INTO check_results (run_id, check_name, verdict, measured, message, evidence, findings) ",
                );
                qb.push_values(chunk, |mut b, c| {
                    b.push_bind(run)
                        .push_bind(c.name.as_str())
                        .push_bind(c.verdict.as_str())
                        .push_bind(c.measured.to_string());
                    if PG {
                        b.push_unseparated("::jsonb");
                    }
                    b.push_bind(c.message.as_str())
                        .push_bind(cut_evidence(&c.evidence))
                        .push_bind(findings_text(&c.findings));
                    if PG {
                        b.push_unseparated("::jsonb");
                    }
                });
                qb.build().execute(&mut *tx).await?;
            }
            sqlx::query("UPDATE runs SET verdict = $1, finished_at_ms = $2 WHERE id = $3")
                .bind(verdict.as_str())
                .bind(now_ms)
                .bind(run)
                .execute(&mut *tx)
                .await?;
            let early = options.dead_letter_now.as_deref().filter(|_| verdict == RunVerdict::Fail);
            let state = match early {
                Some(_) => NodeState::DeadLettered,
                None => state_after(verdict, attempt),
            };
            let failed: Vec<&str> = checks
                .iter()
                .filter(|c| matches!(c.verdict, CheckVerdict::Fail | CheckVerdict::Error))
                .map(|c| c.name.as_str())
                .collect();
            let mut reason = match (verdict, failed.is_empty()) {
                (RunVerdict::Pass, _) => format!("attempt {attempt} passed"),
                (RunVerdict::Fail, true) => format!("attempt {attempt} failed"),
                (RunVerdict::Fail, false) => format!("attempt {attempt} failed: {}", failed.join(", ")),
            };
            if let Some(why) = early {
                reason.push_str(&format!(" (dead-lettered at once: {why})"));
            }
            set_state(&mut tx, &hostname, state, &reason, cycle, i64::from(attempt), now_ms).await?;
            tx.commit().await?;
            Ok(FinishRun { state, already_finished: false })
        })
    }

    /// Records something that happened to a node without changing its state (a remediation
    /// command run between attempts): an event with its current state, cycle and attempt.
    /// Returns false when the node is unknown.
    pub async fn add_event(&self, hostname: &str, reason: &str, now_ms: i64) -> Result<bool> {
        on_backend!(self, pool => {
            let done = sqlx::query(
                "INSERT INTO node_events (hostname, at_ms, cycle, attempt, state, reason) \
                 SELECT hostname, $1, cycle, attempt, state, $2 FROM nodes WHERE hostname = $3",
            )
            .bind(now_ms)
            .bind(reason)
            .bind(hostname)
            .execute(pool)
            .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    /// The node's row, its state changes and its runs with their checks; `None` if unknown.
    pub async fn node_history(&self, hostname: &str) -> Result<Option<NodeHistory>> {
        on_backend!(self, pool => {
            let labels_col = if PG { "labels::text AS labels" } else { "labels" };
            let cols = NODE_COLUMNS.replace("labels", labels_col);
            let Some(row) = sqlx::query(&format!("SELECT {cols} FROM nodes WHERE hostname = $1"))
                .bind(hostname)
                .fetch_optional(pool)
                .await?
            else {
                return Ok(None);
            };
            let labels: String = row.try_get("labels")?;
            let state: String = row.try_get("state")?;
            let node = NodeRecord {
                spec: NodeSpec {
                    hostname: row.try_get("hostname")?,
                    rack: row.try_get("rack")?,
                    bmc_address: row.try_get("bmc_address")?,
                    gpu_model: row.try_get("gpu_model")?,
                    gpu_count: u8::try_from(row.try_get::<i64, _>("gpu_count")?)
                        .map_err(|_| StoreError::Corrupt("gpu_count".into()))?,
                    firmware_bmc: row.try_get("firmware_bmc")?,
                    firmware_bios: row.try_get("firmware_bios")?,
                    firmware_gpu_vbios: row.try_get("firmware_gpu_vbios")?,
                    firmware_nic: row.try_get("firmware_nic")?,
                    labels: serde_json::from_str(&labels)
                        .map_err(|e| StoreError::Corrupt(format!("labels of {hostname}: {e}")))?,
                },
                state: state.parse()?,
                state_reason: row.try_get("state_reason")?,
                cycle: u32_of(row.try_get("cycle")?, "cycle")?,
                attempt: u32_of(row.try_get("attempt")?, "attempt")?,
                registered_at_ms: row.try_get("registered_at_ms")?,
                updated_at_ms: row.try_get("updated_at_ms")?,
            };
            let mut events = Vec::new();
            for row in sqlx::query(
                "SELECT at_ms, cycle, attempt, state, reason FROM node_events WHERE hostname = $1 ORDER BY id",
            )
            .bind(hostname)
            .fetch_all(pool)
            .await?
            {
                let state: String = row.try_get("state")?;
                events.push(NodeEvent {
                    at_ms: row.try_get("at_ms")?,
                    cycle: u32_of(row.try_get("cycle")?, "cycle")?,
                    attempt: u32_of(row.try_get("attempt")?, "attempt")?,
                    state: state.parse()?,
                    reason: row.try_get("reason")?,
                });
            }
            let mut runs = Vec::new();
            for row in sqlx::query(
                "SELECT id, cycle, attempt, agent, started_at_ms, finished_at_ms, verdict \
                 FROM runs WHERE hostname = $1 ORDER BY cycle, attempt",
            )
            .bind(hostname)
            .fetch_all(pool)
            .await?
            {
                let verdict: Option<String> = row.try_get("verdict")?;
                runs.push(RunRecord {
                    id: row.try_get("id")?,
                    cycle: u32_of(row.try_get("cycle")?, "cycle")?,
                    attempt: u32_of(row.try_get("attempt")?, "attempt")?,
                    agent: row.try_get("agent")?,
                    started_at_ms: row.try_get("started_at_ms")?,
                    finished_at_ms: row.try_get("finished_at_ms")?,
                    verdict: verdict.as_deref().map(RunVerdict::parse).transpose()?,
                    checks: Vec::new(),
                });
            }
            let measured_col = if PG { "measured::text AS measured" } else { "measured" };
            let findings_col = if PG { "findings::text AS findings" } else { "findings" };
            for run in &mut runs {
                for row in sqlx::query(&format!(
                    "SELECT check_name, verdict, {measured_col}, message, evidence, {findings_col} \
                     FROM check_results WHERE run_id = $1 ORDER BY id"
                ))
                .bind(run.id)
                .fetch_all(pool)
                .await?
                {
                    let verdict: String = row.try_get("verdict")?;
                    let measured: String = row.try_get("measured")?;
                    let findings: String = row.try_get("findings")?;
                    run.checks.push(CheckResult {
                        name: row.try_get("check_name")?,
                        verdict: CheckVerdict::parse(&verdict)?,
                        measured: serde_json::from_str(&measured)
                            .map_err(|e| StoreError::Corrupt(format!("measured values: {e}")))?,
                        message: row.try_get("message")?,
                        evidence: row.try_get("evidence")?,
                        findings: serde_json::from_str(&findings)
                            .map_err(|e| StoreError::Corrupt(format!("findings: {e}")))?,
                    });
                }
            }
            Ok(Some(NodeHistory { node, events, runs }))
        })
    }

    /// Hostnames of `rack`'s nodes, by state (every state present, possibly empty), sorted.
    pub async fn nodes_by_state(&self, rack: &str) -> Result<BTreeMap<NodeState, Vec<String>>> {
        let mut out: BTreeMap<NodeState, Vec<String>> = NodeState::ALL
            .into_iter()
            .map(|s| (s, Vec::new()))
            .collect();
        on_backend!(self, pool => {
            for row in sqlx::query("SELECT hostname, state FROM nodes WHERE rack = $1 ORDER BY hostname")
                .bind(rack)
                .fetch_all(pool)
                .await?
            {
                let state: String = row.try_get("state")?;
                out.entry(state.parse()?).or_default().push(row.try_get("hostname")?);
            }
        });
        Ok(out)
    }
}

fn labels_json(spec: &NodeSpec) -> String {
    match serde_json::to_string(&spec.labels) {
        Ok(s) => s,
        Err(e) => unreachable!("a map of strings always serialises: {e}"),
    }
}

/// A check's findings as stored: a JSON list.
fn findings_text(f: &[Finding]) -> String {
    match serde_json::to_string(f) {
        Ok(s) => s,
        Err(e) => unreachable!("findings are plain data and always serialise: {e}"),
    }
}

/// The state a finished attempt leads to.
pub fn state_after(verdict: RunVerdict, attempt: u32) -> NodeState {
    match verdict {
        RunVerdict::Pass => NodeState::Passed,
        RunVerdict::Fail if attempt >= MAX_ATTEMPTS => NodeState::DeadLettered,
        RunVerdict::Fail => NodeState::Retrying,
    }
}

/// Sets a node's state and appends the event, inside the caller's transaction.
async fn set_state<'c, DB>(
    tx: &mut sqlx::Transaction<'c, DB>,
    hostname: &str,
    state: NodeState,
    reason: &str,
    cycle: i64,
    attempt: i64,
    now_ms: i64,
) -> Result<()>
where
    DB: sqlx::Database,
    for<'e> &'e mut DB::Connection: sqlx::Executor<'e, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    sqlx::query(
        "UPDATE nodes SET state = $1, state_reason = $2, cycle = $3, attempt = $4, updated_at_ms = $5 \
         WHERE hostname = $6",
    )
    .bind(state.as_str())
    .bind(reason)
    .bind(cycle)
    .bind(attempt)
    .bind(now_ms)
    .bind(hostname)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO node_events (hostname, at_ms, cycle, attempt, state, reason) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(hostname)
    .bind(now_ms)
    .bind(cycle)
    .bind(attempt)
    .bind(state.as_str())
    .bind(reason)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_passwords() {
        assert_eq!(
            redact_url("postgres://kiln:s3cret@db:5432/kiln"),
            "postgres://kiln:***@db:5432/kiln"
        );
        assert_eq!(
            redact_url("postgres://kiln@db/kiln"),
            "postgres://kiln@db/kiln"
        );
        assert_eq!(redact_url("sqlite://kiln.db"), "sqlite://kiln.db");
        assert_eq!(
            redact_url("postgres://kiln:a/b@c@db/kiln"),
            "postgres://kiln:***@db/kiln"
        );
        assert_eq!(
            redact_url("postgres://db/kiln?user=kiln&password=s3cret&sslmode=verify-full"),
            "postgres://db/kiln?user=kiln&password=***&sslmode=verify-full"
        );
        assert_eq!(
            redact_url("postgres://kiln:s3cret@db/kiln?sslrootcert=/etc/a@b/ca.crt&SSLPASSWORD=k"),
            "postgres://kiln:***@db/kiln?sslrootcert=/etc/a@b/ca.crt&SSLPASSWORD=***"
        );
    }

    #[tokio::test]
    async fn a_password_apart_from_the_url_is_for_postgres_and_never_a_second_one() {
        for (url, want) in [
            ("sqlite::memory:", "only a PostgreSQL store"),
            ("postgres://kiln:inurl-pw@127.0.0.1:1/kiln", "keep one"),
            (
                "postgres://kiln@127.0.0.1:1/kiln?password=inurl-pw",
                "keep one",
            ),
        ] {
            let err = Store::connect_with_password(url, Some("apart-pw"))
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(want), "{url}: {err}");
            assert!(!err.contains("-pw"), "{err}");
        }
    }

    #[test]
    fn states_and_verdicts() {
        for s in NodeState::ALL {
            assert_eq!(s.as_str().parse::<NodeState>().ok(), Some(s));
        }
        assert!("lost".parse::<NodeState>().is_err());
        assert_eq!(
            state_after(RunVerdict::Pass, MAX_ATTEMPTS),
            NodeState::Passed
        );
        assert_eq!(
            state_after(RunVerdict::Fail, MAX_ATTEMPTS - 1),
            NodeState::Retrying
        );
        assert_eq!(
            state_after(RunVerdict::Fail, MAX_ATTEMPTS),
            NodeState::DeadLettered
        );
        assert!(NodeState::Retrying.in_progress() && !NodeState::Passed.in_progress());
    }

    #[test]
    fn evidence_is_cut_on_a_char_boundary() {
        let s = "é".repeat(EVIDENCE_BYTES_MAX / 2 + 1);
        let cut = cut_evidence(&s);
        assert!(cut.starts_with('é') && cut.contains("bytes cut by kiln-store"));
        assert_eq!(cut_evidence("short"), "short");
    }
}
