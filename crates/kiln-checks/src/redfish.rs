//! Redfish: a small client for a node's BMC and the checks that use it.
//!
//! Client: reqwest over rustls (ring provider). Every request has a connect and a total
//! timeout and is retried with back-off on connection errors, timeouts, 429 and 5xx.
//! Authentication is none, HTTP basic, or a Redfish session (`X-Auth-Token`, logged in on
//! first use and again once on a 401). TLS trusts the system roots, a given CA bundle, or
//! (explicit opt-out, for BMCs with self-signed certificates) anything.
//!
//! Checks: `bmc_health` (system Health, HealthRollup, PowerState), `bmc_firmware`
//! (FirmwareInventory versus the manifest baseline; `Members` is iterated, its
//! `@odata.count` never trusted), `bmc_sel` (system log entries of a forbidden severity
//! since the node was registered), `bmc_inventory` (GPUs as Processors and PCIe links at
//! their maximum, where the BMC exposes them).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio::sync::Mutex;

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult};
use crate::yaml::{Fields, LoadError};

/// Largest response body read from a BMC.
pub const BODY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Most members read from one collection (across `@odata.nextLink` pages).
pub const MEMBERS_MAX: usize = 10_000;
/// Most pages followed in one collection.
pub const PAGES_MAX: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    Basic {
        user: String,
        password: String,
    },
    /// POST `/redfish/v1/SessionService/Sessions`, then `X-Auth-Token` on every request.
    Session {
        user: String,
        password: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsTrust {
    /// The operating system's trust store.
    SystemRoots,
    /// Only these CA certificates (PEM bundle), e.g. the site's BMC CA.
    CaPem(Vec<u8>),
    /// Accept any certificate and host name. An explicit opt-out for self-signed BMCs:
    /// the connection is encrypted but the BMC is not authenticated.
    InsecureAcceptAny,
}

#[derive(Debug, Clone)]
pub struct RedfishConfig {
    /// `https://10.0.0.11` (or `http://127.0.0.1:8000` for an emulator).
    pub base_url: String,
    pub auth: Auth,
    pub tls: TlsTrust,
    pub connect_timeout: Duration,
    /// Whole request, body included.
    pub request_timeout: Duration,
    /// Extra attempts after the first, for retryable failures.
    pub retries: u32,
    /// Wait before the first retry; doubles each time.
    pub retry_backoff: Duration,
}

impl RedfishConfig {
    /// Defaults for a BMC at `address` (`host` or `host:port`) over HTTPS.
    pub fn for_address(address: &str, auth: Auth, tls: TlsTrust) -> RedfishConfig {
        RedfishConfig {
            base_url: format!("https://{address}"),
            auth,
            tls,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            retries: 2,
            retry_backoff: Duration::from_millis(500),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedfishError {
    #[error("invalid Redfish client settings: {0}")]
    Config(String),
    #[error("GET {path}: cannot connect to the BMC: {reason}")]
    Connect { path: String, reason: String },
    #[error("GET {path}: timed out after {:.1} s", after.as_secs_f64())]
    Timeout { path: String, after: Duration },
    #[error("{method} {path}: HTTP {status}: {body}")]
    Http {
        method: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("GET {path}: {reason}")]
    Body { path: String, reason: String },
    #[error("session login failed: {0}")]
    Login(String),
}

impl RedfishError {
    fn retryable(&self) -> bool {
        match self {
            RedfishError::Connect { .. } | RedfishError::Timeout { .. } => true,
            RedfishError::Http { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

#[derive(Debug, Clone)]
struct Session {
    token: String,
    location: Option<String>,
}

pub struct RedfishClient {
    http: reqwest::Client,
    base: String,
    auth: Auth,
    retries: u32,
    retry_backoff: Duration,
    request_timeout: Duration,
    session: Mutex<Option<Session>>,
}

impl RedfishClient {
    pub fn new(cfg: RedfishConfig) -> Result<RedfishClient, RedfishError> {
        // reqwest is built without a default crypto provider (no aws-lc build); use ring.
        // Fails harmlessly when a provider is already installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = cfg.base_url.trim_end_matches('/').to_string();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(RedfishError::Config(format!(
                "base_url {base:?} must start with https:// or http://"
            )));
        }
        let mut b = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .timeout(cfg.request_timeout)
            .redirect(reqwest::redirect::Policy::limited(3))
            .user_agent(concat!("kiln-checks/", env!("CARGO_PKG_VERSION")));
        match &cfg.tls {
            TlsTrust::SystemRoots => {}
            TlsTrust::CaPem(pem) => {
                let certs = reqwest::Certificate::from_pem_bundle(pem)
                    .map_err(|e| RedfishError::Config(format!("CA bundle: {e}")))?;
                if certs.is_empty() {
                    return Err(RedfishError::Config(
                        "CA bundle holds no certificate".into(),
                    ));
                }
                b = b.tls_certs_only(certs);
            }
            TlsTrust::InsecureAcceptAny => {
                b = b
                    .tls_danger_accept_invalid_certs(true)
                    .tls_danger_accept_invalid_hostnames(true);
            }
        }
        let http = b
            .build()
            .map_err(|e| RedfishError::Config(format!("HTTP client: {e}")))?;
        Ok(RedfishClient {
            http,
            base,
            auth: cfg.auth,
            retries: cfg.retries,
            retry_backoff: cfg.retry_backoff,
            request_timeout: cfg.request_timeout,
            session: Mutex::new(None),
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else {
            format!("{}{}", self.base, path)
        }
    }

    /// GETs a Redfish resource as JSON, with retries and authentication.
    pub async fn get(&self, path: &str) -> Result<Value, RedfishError> {
        let mut relogged = false;
        let mut attempt = 0u32;
        let mut backoff = self.retry_backoff;
        loop {
            match self.get_once(path).await {
                Ok(v) => return Ok(v),
                Err(RedfishError::Http { status: 401, .. })
                    if matches!(self.auth, Auth::Session { .. }) && !relogged =>
                {
                    relogged = true;
                    *self.session.lock().await = None;
                }
                Err(e) if e.retryable() && attempt < self.retries => {
                    attempt += 1;
                    tracing::debug!(path, attempt, error = %e, "retrying Redfish GET");
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn get_once(&self, path: &str) -> Result<Value, RedfishError> {
        let mut req = self
            .http
            .get(self.url(path))
            .header("Accept", "application/json")
            .header("OData-Version", "4.0");
        match &self.auth {
            Auth::None => {}
            Auth::Basic { user, password } => req = req.basic_auth(user, Some(password)),
            Auth::Session { .. } => {
                let token = self.session_token().await?;
                req = req.header("X-Auth-Token", token);
            }
        }
        let resp = req.send().await.map_err(|e| self.send_error(path, e))?;
        read_json("GET", path, resp, self.request_timeout).await
    }

    fn send_error(&self, path: &str, e: reqwest::Error) -> RedfishError {
        if e.is_timeout() {
            RedfishError::Timeout {
                path: path.to_string(),
                after: self.request_timeout,
            }
        } else {
            RedfishError::Connect {
                path: path.to_string(),
                reason: error_chain(&e),
            }
        }
    }

    async fn session_token(&self) -> Result<String, RedfishError> {
        let mut guard = self.session.lock().await;
        if let Some(s) = guard.as_ref() {
            return Ok(s.token.clone());
        }
        let Auth::Session { user, password } = &self.auth else {
            return Err(RedfishError::Login("not using session auth".into()));
        };
        let path = "/redfish/v1/SessionService/Sessions";
        let resp = self
            .http
            .post(self.url(path))
            .header("Accept", "application/json")
            .json(&json!({ "UserName": user, "Password": password }))
            .send()
            .await
            .map_err(|e| RedfishError::Login(error_chain(&e)))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(RedfishError::Login(format!("POST {path}: HTTP {status}")));
        }
        let token = resp
            .headers()
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| RedfishError::Login("no X-Auth-Token in the response".into()))?;
        let location = resp
            .headers()
            .get("Location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        *guard = Some(Session {
            token: token.clone(),
            location,
        });
        Ok(token)
    }

    /// Deletes the Redfish session, if one was opened (BMCs have few session slots).
    pub async fn logout(&self) {
        let session = self.session.lock().await.take();
        if let Some(Session {
            token,
            location: Some(loc),
        }) = session
        {
            let _ = self
                .http
                .delete(self.url(&loc))
                .header("X-Auth-Token", token)
                .send()
                .await;
        }
    }

    /// The members of a collection, following `Members@odata.nextLink`. Members that are
    /// only links are returned as such; `expand` fetches each one.
    /// `Members@odata.count` is never used (BMCs get it wrong).
    pub async fn members(
        &self,
        collection: &str,
        expand: bool,
    ) -> Result<Vec<Value>, RedfishError> {
        let mut out = Vec::new();
        let mut next = Some(collection.to_string());
        let mut pages = 0;
        while let Some(path) = next.take() {
            pages += 1;
            let doc = self.get(&path).await?;
            for m in doc
                .get("Members")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if out.len() >= MEMBERS_MAX {
                    return Ok(out);
                }
                out.push(m.clone());
            }
            if pages < PAGES_MAX {
                next = doc
                    .get("Members@odata.nextLink")
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
        }
        if expand {
            let mut full = Vec::with_capacity(out.len());
            for m in out {
                full.push(self.resolve(&m).await?);
            }
            out = full;
        }
        Ok(out)
    }

    /// A member or link: `{"@odata.id": ...}` alone is fetched; a full object is kept.
    pub async fn resolve(&self, v: &Value) -> Result<Value, RedfishError> {
        match v.as_object() {
            Some(o) if o.len() == 1 => match o.get("@odata.id").and_then(Value::as_str) {
                Some(id) => self.get(id).await,
                None => Ok(v.clone()),
            },
            _ => Ok(v.clone()),
        }
    }
}

async fn read_json(
    method: &str,
    path: &str,
    mut resp: reqwest::Response,
    timeout: Duration,
) -> Result<Value, RedfishError> {
    let status = resp.status().as_u16();
    // HTTP/1.0 servers (some BMCs, sushy-static) end a body by closing the connection, and
    // over TLS some close without close_notify, which rustls reports as an unexpected EOF.
    // Such a body is accepted only if it then parses as a whole JSON object (a cut one
    // does not), so truncation is still caught.
    let close_delimited = resp.content_length().is_none();
    let mut eof_without_close_notify = false;
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if body.len() + c.len() > BODY_BYTES_MAX {
                    return Err(RedfishError::Body {
                        path: path.to_string(),
                        reason: format!("response larger than {BODY_BYTES_MAX} bytes"),
                    });
                }
                body.extend_from_slice(&c);
            }
            Ok(None) => break,
            Err(e) if e.is_timeout() => {
                return Err(RedfishError::Timeout {
                    path: path.to_string(),
                    after: timeout,
                })
            }
            Err(e) if close_delimited && is_unexpected_eof(&e) => {
                eof_without_close_notify = true;
                break;
            }
            Err(e) => {
                return Err(RedfishError::Connect {
                    path: path.to_string(),
                    reason: error_chain(&e),
                })
            }
        }
    }
    if !(200..300).contains(&status) {
        let text = String::from_utf8_lossy(&body);
        return Err(RedfishError::Http {
            method: method.to_string(),
            path: path.to_string(),
            status,
            body: text.chars().take(300).collect(),
        });
    }
    let value: Value = serde_json::from_slice(&body).map_err(|e| RedfishError::Body {
        path: path.to_string(),
        reason: format!("not JSON: {e}"),
    })?;
    if eof_without_close_notify && !value.is_object() {
        return Err(RedfishError::Body {
            path: path.to_string(),
            reason: "connection closed without TLS close_notify and the body is not a JSON object"
                .into(),
        });
    }
    Ok(value)
}

fn is_unexpected_eof(e: &reqwest::Error) -> bool {
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(inner) = src {
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::UnexpectedEof {
                return true;
            }
        }
        src = inner.source();
    }
    false
}

/// An error with its sources: reqwest's top-level message alone hides the TLS reason.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn text(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn odata_id(v: &Value) -> Option<String> {
    text(v, "/@odata.id")
}

// ---------------------------------------------------------------------------------------
// Checks

/// Baseline components a firmware inventory member can be compared with.
pub const FIRMWARE_COMPONENTS: [&str; 4] = ["bmc", "bios", "gpu_vbios", "nic"];

#[derive(Debug, Clone, PartialEq)]
pub enum BmcSpec {
    Health {
        power_state: String,
        health_allowed: Vec<String>,
    },
    Firmware {
        /// (baseline component, FirmwareInventory member Id)
        inventory_ids: Vec<(String, String)>,
    },
    Sel {
        severities: Vec<String>,
    },
    Inventory {
        gpu_count: Option<u64>,
        /// Fail when the BMC lists no GPU at all (otherwise: not exposed, not checked).
        gpus_required: bool,
        pcie_at_max: bool,
    },
}

impl BmcSpec {
    pub const KINDS: [&'static str; 4] = ["bmc_health", "bmc_firmware", "bmc_sel", "bmc_inventory"];

    pub fn fields(kind: &str) -> &'static [&'static str] {
        match kind {
            "bmc_health" => &["power_state", "health_allowed"],
            "bmc_firmware" => &["inventory_ids"],
            "bmc_sel" => &["severities"],
            "bmc_inventory" => &["gpu_count", "gpus_required", "pcie_at_max"],
            _ => &[],
        }
    }

    pub(crate) fn parse(
        kind: &str,
        f: &mut Fields<'_>,
        errors: &mut Vec<LoadError>,
    ) -> Option<BmcSpec> {
        const HEALTH: [&str; 3] = ["OK", "Warning", "Critical"];
        Some(match kind {
            "bmc_health" => BmcSpec::Health {
                power_state: f
                    .opt_choice("power_state", &["On", "Off"], errors)
                    .unwrap_or_else(|| "On".into()),
                health_allowed: f
                    .opt_str_list("health_allowed", Some(&HEALTH), errors)
                    .unwrap_or_else(|| vec!["OK".into()]),
            },
            "bmc_firmware" => BmcSpec::Firmware {
                inventory_ids: f
                    .opt_str_map("inventory_ids", &FIRMWARE_COMPONENTS, errors)
                    .unwrap_or_else(|| {
                        vec![("bmc".into(), "BMC".into()), ("bios".into(), "BIOS".into())]
                    }),
            },
            "bmc_sel" => BmcSpec::Sel {
                severities: f
                    .opt_str_list("severities", Some(&HEALTH), errors)
                    .unwrap_or_else(|| vec!["Critical".into()]),
            },
            "bmc_inventory" => BmcSpec::Inventory {
                gpu_count: f.opt_u64("gpu_count", 0..=64, errors),
                gpus_required: f.opt_bool("gpus_required", errors).unwrap_or(false),
                pcie_at_max: f.opt_bool("pcie_at_max", errors).unwrap_or(true),
            },
            _ => return None,
        })
    }
}

/// A Redfish check as a playbook step.
pub struct BmcCheck {
    pub name: String,
    pub spec: BmcSpec,
}

impl Check for BmcCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            let Some(bmc) = ctx.bmc.as_deref() else {
                return CheckResult::error(
                    &self.name,
                    format!("no BMC client for {} in this run", ctx.node.hostname),
                );
            };
            let outcome = match &self.spec {
                BmcSpec::Health {
                    power_state,
                    health_allowed,
                } => health(&self.name, bmc, power_state, health_allowed).await,
                BmcSpec::Firmware { inventory_ids } => {
                    firmware(&self.name, bmc, ctx, inventory_ids).await
                }
                BmcSpec::Sel { severities } => sel(&self.name, bmc, ctx, severities).await,
                BmcSpec::Inventory {
                    gpu_count,
                    gpus_required,
                    pcie_at_max,
                } => {
                    let expected = gpu_count.unwrap_or(u64::from(ctx.node.gpu_count));
                    inventory(&self.name, bmc, expected, *gpus_required, *pcie_at_max).await
                }
            };
            outcome.unwrap_or_else(|e| {
                CheckResult::error(&self.name, format!("BMC {}: {e}", bmc.base_url()))
            })
        })
    }
}

async fn systems(bmc: &RedfishClient) -> Result<Vec<Value>, RedfishError> {
    bmc.members("/redfish/v1/Systems", true).await
}

fn system_label(s: &Value) -> String {
    format!("system {}", text(s, "/Id").unwrap_or_else(|| "?".into()))
}

async fn health(
    name: &str,
    bmc: &RedfishClient,
    power_state: &str,
    allowed: &[String],
) -> Result<CheckResult, RedfishError> {
    let systems = systems(bmc).await?;
    let mut problems = Vec::new();
    let mut measured = Vec::new();
    if systems.is_empty() {
        problems.push("the BMC lists no ComputerSystem".to_string());
    }
    for s in &systems {
        let label = system_label(s);
        let health = text(s, "/Status/Health");
        let rollup = text(s, "/Status/HealthRollup");
        let power = text(s, "/PowerState");
        let conditions: Vec<String> = s
            .pointer("/Status/Conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| text(c, "/Message"))
            .collect();
        let why = if conditions.is_empty() {
            String::new()
        } else {
            format!(": {}", conditions.join(" | "))
        };
        for (what, value) in [("Health", &health), ("HealthRollup", &rollup)] {
            match value {
                Some(v) if allowed.contains(v) => {}
                Some(v) => problems.push(format!("{label}: {what} {v} (allowed {allowed:?}){why}")),
                None if what == "Health" => problems.push(format!("{label}: no Status.Health")),
                None => {}
            }
        }
        match &power {
            Some(p) if p == power_state => {}
            other => problems.push(format!(
                "{label}: PowerState {}, expected {power_state}",
                other.as_deref().unwrap_or("(missing)")
            )),
        }
        measured.push(json!({
            "system": text(s, "/Id"), "health": health, "health_rollup": rollup,
            "power_state": power, "conditions": conditions,
        }));
    }
    Ok(CheckResult::from_problems(
        name,
        problems,
        format!("{} system(s) healthy and {power_state}", systems.len()),
        json!({ "systems": measured }),
    )
    .evidence(
        json!({ "systems": systems.iter().map(|s| s.get("Status").cloned()).collect::<Vec<_>>() }),
    ))
}

async fn firmware(
    name: &str,
    bmc: &RedfishClient,
    ctx: &CheckContext,
    inventory_ids: &[(String, String)],
) -> Result<CheckResult, RedfishError> {
    let collection_path = match bmc.get("/redfish/v1/UpdateService").await {
        Ok(us) => text(&us, "/FirmwareInventory/@odata.id")
            .unwrap_or_else(|| "/redfish/v1/UpdateService/FirmwareInventory".into()),
        Err(_) => "/redfish/v1/UpdateService/FirmwareInventory".into(),
    };
    let collection = bmc.get(&collection_path).await?;
    let claimed = collection
        .get("Members@odata.count")
        .and_then(Value::as_u64);
    let items = bmc.members(&collection_path, true).await?;
    let inventory: Vec<(String, String, Option<String>)> = items
        .iter()
        .map(|i| {
            (
                text(i, "/Id").unwrap_or_default(),
                text(i, "/Name").unwrap_or_default(),
                text(i, "/Version"),
            )
        })
        .collect();
    let mut problems = Vec::new();
    let mut unknown = Vec::new();
    let mut compared = Vec::new();
    for (component, id) in inventory_ids {
        let Some(want) = ctx.node.firmware.get(component) else {
            unknown.push(format!(
                "no {component} firmware baseline for this node in the manifest"
            ));
            continue;
        };
        match inventory
            .iter()
            .find(|(i, _, _)| i.eq_ignore_ascii_case(id))
        {
            None => problems.push(format!(
                "{component}: no FirmwareInventory member {id:?} (members: {})",
                inventory
                    .iter()
                    .map(|(i, _, _)| i.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some((_, fw_name, version)) => {
                let have = version.as_deref().unwrap_or("(no Version)");
                if have.trim() != want {
                    problems.push(format!(
                        "{component} ({fw_name}): version {have:?}, baseline {want:?}"
                    ));
                }
                compared.push(json!({ "component": component, "id": id, "version": version, "baseline": want }));
            }
        }
    }
    let measured = json!({
        "compared": compared,
        "members_listed": inventory.len(),
        "members_odata_count": claimed,
    });
    let evidence = json!({
        "inventory": inventory.iter().map(|(i, n, v)| json!({"id": i, "name": n, "version": v})).collect::<Vec<_>>(),
    });
    if problems.is_empty() && !unknown.is_empty() {
        return Ok(CheckResult::error(name, unknown.join("; "))
            .measured(measured)
            .evidence(evidence));
    }
    Ok(CheckResult::from_problems(
        name,
        problems,
        format!("{} firmware component(s) at baseline", compared.len()),
        measured,
    )
    .evidence(evidence))
}

async fn sel(
    name: &str,
    bmc: &RedfishClient,
    ctx: &CheckContext,
    severities: &[String],
) -> Result<CheckResult, RedfishError> {
    let since = ctx.node.registered_at;
    let mut problems = Vec::new();
    let mut scanned = 0u64;
    let mut older = 0u64;
    let mut evidence = Vec::new();
    for s in systems(bmc).await? {
        let Some(logs_path) = text(&s, "/LogServices/@odata.id") else {
            continue;
        };
        for log in bmc.members(&logs_path, true).await? {
            let Some(entries_path) = text(&log, "/Entries/@odata.id") else {
                continue;
            };
            let log_id = format!(
                "{}/{}",
                text(&s, "/Id").unwrap_or_default(),
                text(&log, "/Id").unwrap_or_default()
            );
            for e in bmc.members(&entries_path, false).await? {
                let e = bmc.resolve(&e).await?;
                scanned += 1;
                if text(&e, "/EntryType").is_some_and(|t| t != "SEL") {
                    continue;
                }
                let severity = text(&e, "/Severity").unwrap_or_default();
                if !severities.contains(&severity) {
                    continue;
                }
                let created = text(&e, "/Created");
                let when = created
                    .as_deref()
                    .and_then(|c| OffsetDateTime::parse(c, &Rfc3339).ok());
                if when.is_some_and(|w| w < since) {
                    older += 1;
                    continue;
                }
                let message = text(&e, "/Message").unwrap_or_default();
                problems.push(format!(
                    "SEL {log_id} entry {} at {}: {severity}: {message}",
                    text(&e, "/Id").unwrap_or_default(),
                    created.as_deref().unwrap_or("(no valid Created time)"),
                ));
                evidence.push(e);
            }
        }
    }
    let since_text = since.format(&Rfc3339).unwrap_or_default();
    Ok(CheckResult::from_problems(
        name,
        problems,
        format!("no {severities:?} SEL entries since {since_text} ({scanned} entries scanned)"),
        json!({ "entries_scanned": scanned, "forbidden_before_registration": older, "since": since_text }),
    )
    .evidence(json!({ "entries": evidence })))
}

async fn inventory(
    name: &str,
    bmc: &RedfishClient,
    expected_gpus: u64,
    gpus_required: bool,
    pcie_at_max: bool,
) -> Result<CheckResult, RedfishError> {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let mut gpus = Vec::new();
    let mut pcie_links: BTreeMap<String, Value> = BTreeMap::new();
    let systems = systems(bmc).await?;
    for s in &systems {
        if let Some(p) = text(s, "/Processors/@odata.id") {
            for proc_ in bmc.members(&p, true).await? {
                if text(&proc_, "/ProcessorType").as_deref() == Some("GPU") {
                    gpus.push(proc_);
                }
            }
        }
        // Older schema: an array of device links on the system.
        if let Some(list) = s.get("PCIeDevices").and_then(Value::as_array) {
            for l in list {
                if let Some(id) = odata_id(l) {
                    pcie_links.entry(id).or_insert(Value::Null);
                }
            }
        }
    }
    for c in bmc.members("/redfish/v1/Chassis", true).await? {
        if let Some(p) = text(&c, "/PCIeDevices/@odata.id") {
            for l in bmc.members(&p, false).await? {
                if let Some(id) = odata_id(&l) {
                    pcie_links.entry(id).or_insert(Value::Null);
                }
            }
        }
    }
    for g in &gpus {
        let health = text(g, "/Status/Health");
        if let Some(h) = &health {
            if h != "OK" {
                problems.push(format!(
                    "GPU {} ({}): Health {h}",
                    text(g, "/Id").unwrap_or_default(),
                    text(g, "/Model").unwrap_or_default()
                ));
            }
        }
    }
    if gpus.is_empty() {
        if gpus_required && expected_gpus > 0 {
            problems.push(format!("the BMC lists no GPU, expected {expected_gpus}"));
        } else {
            notes.push("the BMC exposes no GPU processors (not checked)".to_string());
        }
    } else if gpus.len() as u64 != expected_gpus {
        problems.push(format!(
            "the BMC lists {} GPU(s) ({}), expected {expected_gpus}",
            gpus.len(),
            gpus.iter()
                .filter_map(|g| text(g, "/Id"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut devices = Vec::new();
    for id in pcie_links.keys() {
        let d = bmc.get(id).await?;
        let iface = d.get("PCIeInterface");
        let label = format!(
            "PCIe device {} ({})",
            text(&d, "/Id").unwrap_or_default(),
            text(&d, "/Name").unwrap_or_default()
        );
        if let Some(i) = iface {
            let cur = text(i, "/PCIeType");
            let max = text(i, "/MaxPCIeType");
            let lanes = i.get("LanesInUse").and_then(Value::as_u64);
            let max_lanes = i.get("MaxLanes").and_then(Value::as_u64);
            if pcie_at_max {
                if let (Some(c), Some(m)) = (&cur, &max) {
                    if gen_number(c) < gen_number(m) {
                        problems.push(format!("{label}: link {c}, max {m}"));
                    }
                }
                if let (Some(l), Some(m)) = (lanes, max_lanes) {
                    if l < m {
                        problems.push(format!("{label}: x{l} lanes in use, max x{m}"));
                    }
                }
            }
            devices.push(json!({
                "id": id, "pcie_type": cur, "max_pcie_type": max, "lanes_in_use": lanes, "max_lanes": max_lanes,
            }));
        }
    }
    let mut pass_msg = format!(
        "{} GPU(s), {} PCIe device(s) at their maximum link",
        gpus.len(),
        devices.len()
    );
    if !notes.is_empty() {
        pass_msg.push_str(&format!(" ({})", notes.join("; ")));
    }
    Ok(CheckResult::from_problems(
        name,
        problems,
        pass_msg,
        json!({
            "gpus": gpus.iter().map(|g| json!({"id": text(g, "/Id"), "model": text(g, "/Model"), "health": text(g, "/Status/Health")})).collect::<Vec<_>>(),
            "expected_gpus": expected_gpus,
            "pcie_devices": devices,
            "notes": notes,
        }),
    ))
}

/// `Gen4` -> 4; anything else 0.
fn gen_number(s: &str) -> u32 {
    s.trim_start_matches("Gen").parse().unwrap_or(0)
}
