//! The operators' dashboard: server-rendered HTML over the results store and the broker's
//! consumer lag. No JavaScript framework and nothing loaded from another origin: each page is
//! one HTML document with inline CSS and a few lines of inline script for auto-refresh.
//!
//! Pages: `/` (racks with per-state counts and progress, totals, the lag chart),
//! `/racks/{rack}`, `/nodes/{hostname}` (the cycle's components with their findings across
//! attempts, then runs, each check's verdict, measured values and evidence), `/dead-letters`
//! (`?action=rma` filters by action), `/lag`, and `/healthz`. See docs/dashboard.md.
//!
//! Embedding: [`serve`] runs the dashboard on a bound listener until `shutdown` completes,
//! behind kiln-web's guard (`config.web`: TLS, and with a token file a token with `read`
//! scope on every page but `/healthz`, asked for with HTTP Basic so a browser prompts);
//! [`router`] gives the axum router alone (tests, other servers).

pub mod chart;
pub mod html;
pub mod lag;
pub mod pages;
pub mod seed;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use kiln_store::Store;
use maud::{html, Markup};
use tokio::net::TcpListener;

use crate::lag::{LagHistory, LagSampler};

/// Dead letters listed on one page (the page says how many there are in all).
pub const DEAD_LETTERS_SHOWN: u32 = 500;

/// How the dashboard runs.
#[derive(Debug, Clone)]
pub struct DashboardConfig {
    /// Broker to sample consumer lag from; `None`: no lag sampling.
    pub bootstrap: Option<String>,
    /// Time between lag samples.
    pub lag_interval: Duration,
    /// Samples kept per series (the default, 720 at 5 s, is one hour).
    pub lag_points: usize,
    /// Series kept at most (group × topic × partition).
    pub lag_series_max: usize,
    /// Wait for any one broker exchange.
    pub broker_timeout: Duration,
    /// Pages reload themselves this often (the operator can switch it off on the page).
    pub refresh_secs: u64,
    /// How the lag sampler reaches the broker (TLS, SASL).
    pub kafka: kiln_client::Security,
    /// How the dashboard's own listener is secured.
    pub web: kiln_web::WebSecurity,
    /// Connections served at once.
    pub connections_max: usize,
}

impl DashboardConfig {
    pub fn new(bootstrap: Option<String>) -> DashboardConfig {
        DashboardConfig {
            bootstrap,
            lag_interval: Duration::from_secs(5),
            lag_points: 720,
            lag_series_max: 512,
            broker_timeout: Duration::from_secs(5),
            refresh_secs: 10,
            kafka: kiln_client::Security::default(),
            web: kiln_web::WebSecurity::default(),
            connections_max: kiln_web::CONNECTIONS_MAX_DEFAULT,
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    store: Store,
    lag: Arc<Mutex<LagHistory>>,
    config: Arc<DashboardConfig>,
}

impl AppState {
    pub fn new(store: Store, config: DashboardConfig) -> AppState {
        let history = LagHistory::new(now_ms(), config.lag_points, config.lag_series_max);
        AppState {
            store,
            lag: Arc::new(Mutex::new(history)),
            config: Arc::new(config),
        }
    }

    /// The lag history (shared with the sampler).
    pub fn lag(&self) -> Arc<Mutex<LagHistory>> {
        self.lag.clone()
    }

    fn lag_snapshot(&self) -> LagHistory {
        match self.lag.lock() {
            Ok(h) => h.clone(),
            // A panicked sampler leaves the data as it was; showing it is still right.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// The dashboard's routes over `state`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/racks/{rack}", get(rack))
        .route("/nodes/{hostname}", get(node))
        .route("/dead-letters", get(dead_letters))
        .route("/lag", get(lag_page))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .with_state(state)
}

/// Serves the dashboard on `listener` until `shutdown` completes, sampling consumer lag from
/// `config.bootstrap` (if given) in the background meanwhile.
pub async fn serve(
    listener: TcpListener,
    store: Store,
    config: DashboardConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(store, config.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = config.bootstrap.clone().map(|bootstrap| {
        tokio::spawn(run_sampler(
            bootstrap,
            config.lag_interval,
            config.broker_timeout,
            config.kafka.clone(),
            state.lag(),
            stop_rx,
        ))
    });
    let guard = kiln_web::Guard::new(
        "kiln dashboard",
        kiln_web::Scope::Read,
        kiln_web::Challenge::Basic,
        config.web.tokens.clone(),
        &["/healthz"],
    );
    let result = kiln_web::serve(
        listener,
        router(state),
        guard,
        &config.web,
        config.connections_max,
        shutdown,
    )
    .await;
    let _ = stop_tx.send(true);
    if let Some(task) = sampler {
        let _ = task.await;
    }
    result.map_err(|e| anyhow::anyhow!("dashboard server: {e}"))
}

/// Samples lag every `interval` into `history` until `stop` turns true. A failed sample is
/// kept as the history's `last_error` (shown on the pages) and retried at the next tick.
pub async fn run_sampler(
    bootstrap: String,
    interval: Duration,
    timeout: Duration,
    security: kiln_client::Security,
    history: Arc<Mutex<LagHistory>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut sampler = LagSampler::new(bootstrap, timeout, security);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let result = tokio::select! {
            r = sampler.sample() => r,
            _ = stop.changed() => return,
        };
        let at = now_ms();
        let mut h = match history.lock() {
            Ok(h) => h,
            Err(poisoned) => poisoned.into_inner(),
        };
        match result {
            Ok(readings) => h.record(at, readings),
            Err(e) => {
                tracing::warn!("lag sample failed: {e:#}");
                h.record_error(at, format!("{e:#}"));
            }
        }
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn page(status: StatusCode, title: &str, refresh: u64, body: Markup) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html::page(title, refresh, body),
    )
        .into_response()
}

fn store_error(e: kiln_store::StoreError) -> Response {
    tracing::error!("dashboard: store query failed: {e}");
    page(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Error",
        0,
        html! { h1 { "Cannot read the results store" } p class="error" { (e.to_string()) } },
    )
}

async fn overview(State(s): State<AppState>) -> Response {
    match s.store.rack_summaries().await {
        Ok(racks) => {
            let body = pages::overview(&racks, &s.lag_snapshot(), now_ms());
            page(StatusCode::OK, "Racks", s.config.refresh_secs, body)
        }
        Err(e) => store_error(e),
    }
}

async fn rack(State(s): State<AppState>, Path(rack): Path<String>) -> Response {
    match s.store.rack_nodes(&rack).await {
        Ok(Some(nodes)) => page(
            StatusCode::OK,
            &format!("Rack {rack}"),
            s.config.refresh_secs,
            pages::rack(&rack, &nodes),
        ),
        Ok(None) => page(
            StatusCode::NOT_FOUND,
            "Unknown rack",
            0,
            html! {
                h1 { "No rack " (rack) }
                p { "The store has no rack by that name. " a href="/" { "All racks" } }
            },
        ),
        Err(e) => store_error(e),
    }
}

async fn node(State(s): State<AppState>, Path(hostname): Path<String>) -> Response {
    match s.store.node_history(&hostname).await {
        Ok(Some(h)) => page(
            StatusCode::OK,
            &format!("Node {hostname}"),
            s.config.refresh_secs,
            pages::node(&h),
        ),
        Ok(None) => page(
            StatusCode::NOT_FOUND,
            "Unknown node",
            0,
            html! {
                h1 { "No node " (hostname) }
                p { "The store has no node by that name. " a href="/" { "All racks" } }
            },
        ),
        Err(e) => store_error(e),
    }
}

/// The `action=` of a query string: `Ok(None)` without one, an error naming the choices for
/// an unknown one.
fn action_filter(query: Option<&str>) -> Result<Option<kiln_findings::Action>, String> {
    let Some(q) = query else { return Ok(None) };
    for pair in q.split('&') {
        match pair.split_once('=') {
            Some(("action", v)) if v.is_empty() || v == "all" => return Ok(None),
            Some(("action", v)) => {
                return kiln_findings::Action::parse(v).map(Some).ok_or_else(|| {
                    let all: Vec<&str> = kiln_findings::Action::ORDER
                        .iter()
                        .map(|a| a.as_str())
                        .collect();
                    format!("unknown action {v:?}; one of: {}", all.join(", "))
                })
            }
            _ => {}
        }
    }
    Ok(None)
}

async fn dead_letters(State(s): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let action = match action_filter(query.as_deref()) {
        Ok(a) => a,
        Err(why) => {
            return page(
                StatusCode::BAD_REQUEST,
                "Bad filter",
                0,
                html! { h1 { "Bad filter" } p class="error" { (why) } p { a href="/dead-letters" { "All dead letters" } } },
            )
        }
    };
    match s.store.dead_letters(DEAD_LETTERS_SHOWN).await {
        Ok((list, total)) => page(
            StatusCode::OK,
            "Dead letters",
            s.config.refresh_secs,
            pages::dead_letters(&list, total, action),
        ),
        Err(e) => store_error(e),
    }
}

async fn lag_page(State(s): State<AppState>) -> Response {
    let src = pages::LagSource {
        bootstrap: s.config.bootstrap.as_deref(),
        interval_s: s.config.lag_interval.as_secs_f64(),
    };
    let body = pages::lag(&s.lag_snapshot(), &src, now_ms());
    page(StatusCode::OK, "Consumer lag", s.config.refresh_secs, body)
}

async fn healthz(State(s): State<AppState>) -> Response {
    match s.store.ping().await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("results store unavailable: {e}\n"),
        )
            .into_response(),
    }
}

async fn not_found() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Not found",
        0,
        html! { h1 { "Not found" } p { a href="/" { "All racks" } } },
    )
}
