//! How the agent reaches a node: its SSH shell and its BMC's Redfish API.
//!
//! Settings (`[ssh]`, `[redfish]` in the agent's TOML) are checked once at start
//! ([`NodeAccess::new`]: key file loads, known_hosts or the explicit opt-out, CA file parses,
//! the address file reads); per run, [`NodeAccess::open`] builds the node's `SshShell` (its
//! address from the per-node overrides, the address file, or the hostname) and
//! `RedfishClient`, and [`NodeSession::close`] disconnects and logs out afterwards. An
//! agent-wide semaphore bounds the SSH connections open at once (`max_sessions`): a run that
//! needs a shell waits for a permit before its deadline starts, and holds it until it closes.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use kiln_checks::redfish::{Auth, RedfishClient, RedfishConfig, TlsTrust};
use kiln_checks::shell::{NodeShell, ShellFuture};
use kiln_checks::ssh::{HostKeyPolicy, SshConfig, SshShell};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// `[ssh]`: how the agent opens a shell on a node. Without `key_path` the agent has no
/// shell, and checks that need one report `Error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SshSettings {
    pub user: String,
    /// OpenSSH private key file (unencrypted): the agent's deploy key.
    pub key_path: Option<PathBuf>,
    /// Host keys are checked against this file (`[host]:port` lines for ports other than 22).
    pub known_hosts: Option<PathBuf>,
    /// Accept any host key: an explicit opt-out for labs; the node is not authenticated.
    pub insecure_accept_any_host_key: bool,
    /// Port used when a node's address names none.
    pub port: u16,
    /// hostname -> `host[:port]`, overriding the address file and the hostname.
    pub addresses: BTreeMap<String, String>,
    /// JSON object hostname -> `host[:port]` (what `kiln sim` writes).
    pub addresses_file: Option<PathBuf>,
    /// SSH connections open at once across the agent (one per node being run).
    pub max_sessions: usize,
    /// Commands running at once on one node (channels of its connection).
    pub sessions_per_node: usize,
    pub connect_timeout_ms: u64,
    /// Upper bound on any one command (0: only the step's own timeout).
    pub command_timeout_max_ms: u64,
    pub keepalive_ms: u64,
}

impl Default for SshSettings {
    fn default() -> Self {
        SshSettings {
            user: "root".into(),
            key_path: None,
            known_hosts: None,
            insecure_accept_any_host_key: false,
            port: 22,
            addresses: BTreeMap::new(),
            addresses_file: None,
            max_sessions: 64,
            sessions_per_node: 4,
            connect_timeout_ms: 10_000,
            command_timeout_max_ms: 0,
            keepalive_ms: 15_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedfishAuthKind {
    None,
    Basic,
    /// A Redfish session (`X-Auth-Token`), deleted after the run.
    Session,
}

/// `[redfish]`: how the agent talks to a node's BMC (`https://<bmc_address>`). Its `Debug`
/// leaves the password out.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedfishSettings {
    pub auth: RedfishAuthKind,
    pub user: Option<String>,
    pub password: Option<String>,
    /// A file holding the password (first line), instead of `password`.
    pub password_file: Option<PathBuf>,
    /// Trust only the CA certificates in this PEM file (default: the system's roots).
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate: an explicit opt-out for self-signed BMCs.
    pub insecure_accept_any_cert: bool,
    pub connect_timeout_ms: u64,
    pub request_timeout_ms: u64,
    /// Extra attempts on connection errors, timeouts, 429 and 5xx.
    pub retries: u32,
    pub retry_backoff_ms: u64,
}

impl std::fmt::Debug for RedfishSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishSettings")
            .field("auth", &self.auth)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| REDACTED))
            .field("password_file", &self.password_file)
            .field("ca_file", &self.ca_file)
            .field("insecure_accept_any_cert", &self.insecure_accept_any_cert)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("retries", &self.retries)
            .field("retry_backoff_ms", &self.retry_backoff_ms)
            .finish()
    }
}

/// What a secret's `Debug` shows.
const REDACTED: &str = "[redacted]";

impl Default for RedfishSettings {
    fn default() -> Self {
        RedfishSettings {
            auth: RedfishAuthKind::None,
            user: None,
            password: None,
            password_file: None,
            ca_file: None,
            insecure_accept_any_cert: false,
            connect_timeout_ms: 5_000,
            request_timeout_ms: 30_000,
            retries: 2,
            retry_backoff_ms: 500,
        }
    }
}

/// What every run uses to reach its node, checked once at start.
pub struct NodeAccess {
    ssh: Option<SshAccess>,
    redfish: RedfishAccess,
}

struct SshAccess {
    settings: SshSettings,
    host_keys: HostKeyPolicy,
    addresses: HashMap<String, (String, u16)>,
    permits: Arc<Semaphore>,
}

struct RedfishAccess {
    settings: RedfishSettings,
    auth: Auth,
    tls: TlsTrust,
}

/// One run's access to its node. Close it when the run ends (success or not); a session
/// dropped unclosed (its task aborted: revoked partition, shutdown) closes itself on a
/// spawned task.
pub struct NodeSession {
    pub shell: Option<Arc<dyn NodeShell>>,
    ssh: Option<Arc<SshShell>>,
    pub bmc: Option<Arc<RedfishClient>>,
    permit: Option<OwnedSemaphorePermit>,
}

/// Longest a drop-triggered close may take.
const CLOSE_ON_DROP_MAX: Duration = Duration::from_secs(30);

impl NodeSession {
    /// Disconnects SSH and deletes the Redfish session (if one was opened).
    pub async fn close(mut self) {
        let (ssh, bmc) = (self.ssh.take(), self.bmc.take());
        close(ssh, bmc).await;
    }
}

async fn close(ssh: Option<Arc<SshShell>>, bmc: Option<Arc<RedfishClient>>) {
    if let Some(s) = ssh {
        s.disconnect().await;
    }
    if let Some(b) = bmc {
        b.logout().await;
    }
}

impl Drop for NodeSession {
    fn drop(&mut self) {
        let (ssh, bmc) = (self.ssh.take(), self.bmc.take());
        if ssh.is_none() && bmc.is_none() {
            return;
        }
        let permit = self.permit.take();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = tokio::time::timeout(CLOSE_ON_DROP_MAX, close(ssh, bmc)).await;
                drop(permit);
            });
        }
    }
}

impl NodeAccess {
    /// Checks the settings and loads what they name (key, known_hosts, CA, addresses).
    pub fn new(ssh: &SshSettings, redfish: &RedfishSettings) -> anyhow::Result<NodeAccess> {
        let ssh = match &ssh.key_path {
            None => {
                if ssh.known_hosts.is_some() || ssh.addresses_file.is_some() {
                    bail!("[ssh] names known_hosts or addresses_file but no key_path");
                }
                None
            }
            Some(key) => Some(SshAccess::new(ssh, key)?),
        };
        Ok(NodeAccess {
            ssh,
            redfish: RedfishAccess::new(redfish)?,
        })
    }

    /// SSH connections the agent may still open now (for tests and metrics).
    pub fn ssh_permits_available(&self) -> Option<usize> {
        self.ssh.as_ref().map(|s| s.permits.available_permits())
    }

    /// Builds the run's shell and BMC client. `needs_shell`: the playbook has a step that
    /// runs commands; only then is an SSH permit taken (waiting for one if all are in use).
    /// `needs_bmc`: it has a Redfish step; only then is a client built.
    pub async fn open(
        &self,
        hostname: &str,
        bmc_address: &str,
        needs_shell: bool,
        needs_bmc: bool,
    ) -> Result<NodeSession, String> {
        let bmc = if needs_bmc {
            Some(Arc::new(self.redfish.client(bmc_address)?))
        } else {
            None
        };
        let (mut shell, mut ssh, mut permit) = (None, None, None);
        if let (true, Some(access)) = (needs_shell, &self.ssh) {
            let p = access
                .permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| format!("SSH permits: {e}"))?;
            let s = Arc::new(access.shell(hostname)?);
            let cap = access.settings.command_timeout_max_ms;
            shell = Some(if cap == 0 {
                s.clone() as Arc<dyn NodeShell>
            } else {
                Arc::new(CappedShell {
                    inner: s.clone(),
                    cap: Duration::from_millis(cap),
                })
            });
            ssh = Some(s);
            permit = Some(p);
        }
        Ok(NodeSession {
            shell,
            ssh,
            bmc,
            permit,
        })
    }
}

impl SshAccess {
    fn new(s: &SshSettings, key: &std::path::Path) -> anyhow::Result<SshAccess> {
        let host_keys = match (&s.known_hosts, s.insecure_accept_any_host_key) {
            (Some(_), true) => {
                bail!("[ssh] known_hosts and insecure_accept_any_host_key exclude each other")
            }
            (Some(p), false) => {
                if !p.is_file() {
                    bail!("[ssh] known_hosts {} is not a readable file", p.display());
                }
                HostKeyPolicy::KnownHosts(p.clone())
            }
            (None, true) => HostKeyPolicy::InsecureAcceptAny,
            (None, false) => bail!(
                "[ssh] needs known_hosts (a file), or insecure_accept_any_host_key = true to \
                 accept any host key"
            ),
        };
        if s.user.trim().is_empty() {
            bail!("[ssh] user must not be empty");
        }
        if s.max_sessions == 0 || s.max_sessions > 100_000 {
            bail!("[ssh] max_sessions must be 1..=100000");
        }
        if s.sessions_per_node == 0 || s.sessions_per_node > 1_000 {
            bail!("[ssh] sessions_per_node must be 1..=1000");
        }
        if s.connect_timeout_ms == 0 {
            bail!("[ssh] connect_timeout_ms must be > 0");
        }
        // Load the key now, so a bad key file stops the agent before any node is touched.
        SshShell::new(SshConfig::new(
            "check",
            &s.user,
            key.to_path_buf(),
            host_keys.clone(),
        ))
        .map_err(|e| anyhow!("[ssh] key_path: {e}"))?;
        let mut addresses = HashMap::new();
        if let Some(file) = &s.addresses_file {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("[ssh] addresses_file {}", file.display()))?;
            let map: BTreeMap<String, String> = serde_json::from_str(&text).with_context(|| {
                format!(
                    "[ssh] addresses_file {}: expected a JSON object of hostname -> \"host:port\"",
                    file.display()
                )
            })?;
            for (host, addr) in map {
                let parsed = parse_address(&addr, s.port)
                    .map_err(|e| anyhow!("[ssh] addresses_file {}: {host}: {e}", file.display()))?;
                addresses.insert(host.to_ascii_lowercase(), parsed);
            }
        }
        for (host, addr) in &s.addresses {
            let parsed =
                parse_address(addr, s.port).map_err(|e| anyhow!("[ssh] addresses.{host}: {e}"))?;
            addresses.insert(host.to_ascii_lowercase(), parsed);
        }
        Ok(SshAccess {
            settings: s.clone(),
            host_keys,
            addresses,
            permits: Arc::new(Semaphore::new(s.max_sessions)),
        })
    }

    fn shell(&self, hostname: &str) -> Result<SshShell, String> {
        let (host, port) = self
            .addresses
            .get(&hostname.to_ascii_lowercase())
            .cloned()
            .unwrap_or_else(|| (hostname.to_string(), self.settings.port));
        let key = self.settings.key_path.clone().unwrap_or_default();
        let mut cfg = SshConfig::new(&host, &self.settings.user, key, self.host_keys.clone());
        cfg.port = port;
        cfg.connect_timeout = Duration::from_millis(self.settings.connect_timeout_ms);
        cfg.sessions_max = self.settings.sessions_per_node;
        cfg.keepalive = Duration::from_millis(self.settings.keepalive_ms.max(1_000));
        SshShell::new(cfg).map_err(|e| format!("SSH to {hostname}: {e}"))
    }
}

/// `host`, `host:port`, `[v6]:port` or a bare IPv6 address.
fn parse_address(addr: &str, default_port: u16) -> Result<(String, u16), String> {
    let addr = addr.trim();
    if addr.is_empty() {
        return Err("empty address".into());
    }
    if let Some(rest) = addr.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{addr:?}: unclosed ["))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| format!("{addr:?}: bad port"))?,
            None if after.is_empty() => default_port,
            None => return Err(format!("{addr:?}: junk after ]")),
        };
        return Ok((host.to_string(), port));
    }
    match addr.matches(':').count() {
        0 => Ok((addr.to_string(), default_port)),
        1 => {
            let (host, port) = addr.split_once(':').unwrap_or((addr, ""));
            let port = port
                .parse()
                .map_err(|_| format!("{addr:?}: bad port {port:?}"))?;
            Ok((host.to_string(), port))
        }
        _ => Ok((addr.to_string(), default_port)), // bare IPv6
    }
}

impl RedfishAccess {
    fn new(s: &RedfishSettings) -> anyhow::Result<RedfishAccess> {
        let password = match (&s.password, &s.password_file) {
            (Some(_), Some(_)) => bail!("[redfish] password and password_file exclude each other"),
            (Some(p), None) => Some(p.clone()),
            (None, Some(f)) => {
                let text = std::fs::read_to_string(f)
                    .with_context(|| format!("[redfish] password_file {}", f.display()))?;
                Some(text.lines().next().unwrap_or_default().to_string())
            }
            (None, None) => None,
        };
        let creds = || -> anyhow::Result<(String, String)> {
            match (&s.user, &password) {
                (Some(u), Some(p)) if !u.trim().is_empty() => Ok((u.clone(), p.clone())),
                _ => bail!(
                    "[redfish] auth = \"{}\" needs user and password (or password_file)",
                    if s.auth == RedfishAuthKind::Basic {
                        "basic"
                    } else {
                        "session"
                    }
                ),
            }
        };
        let auth = match s.auth {
            RedfishAuthKind::None => Auth::None,
            RedfishAuthKind::Basic => {
                let (user, password) = creds()?;
                Auth::Basic { user, password }
            }
            RedfishAuthKind::Session => {
                let (user, password) = creds()?;
                Auth::Session { user, password }
            }
        };
        let tls = match (&s.ca_file, s.insecure_accept_any_cert) {
            (Some(_), true) => {
                bail!("[redfish] ca_file and insecure_accept_any_cert exclude each other")
            }
            (Some(f), false) => {
                let pem = std::fs::read(f)
                    .with_context(|| format!("[redfish] ca_file {}", f.display()))?;
                TlsTrust::CaPem(pem)
            }
            (None, true) => TlsTrust::InsecureAcceptAny,
            (None, false) => TlsTrust::SystemRoots,
        };
        if s.connect_timeout_ms == 0 || s.request_timeout_ms == 0 {
            bail!("[redfish] connect_timeout_ms and request_timeout_ms must be > 0");
        }
        if s.retries > 10 {
            bail!("[redfish] retries must be 0..=10");
        }
        let access = RedfishAccess {
            settings: s.clone(),
            auth,
            tls,
        };
        // Builds one client now, so a bad CA file stops the agent at start.
        access
            .client("127.0.0.1")
            .map_err(|e| anyhow!("[redfish] {e}"))?;
        Ok(access)
    }

    fn client(&self, bmc_address: &str) -> Result<RedfishClient, String> {
        let mut cfg = RedfishConfig::for_address(bmc_address, self.auth.clone(), self.tls.clone());
        if bmc_address.starts_with("https://") {
            cfg.base_url = bmc_address.to_string();
        }
        cfg.connect_timeout = Duration::from_millis(self.settings.connect_timeout_ms);
        cfg.request_timeout = Duration::from_millis(self.settings.request_timeout_ms);
        cfg.retries = self.settings.retries;
        cfg.retry_backoff = Duration::from_millis(self.settings.retry_backoff_ms);
        RedfishClient::new(cfg).map_err(|e| format!("BMC {bmc_address}: {e}"))
    }
}

/// Caps every command's timeout at the agent's `command_timeout_max_ms`.
struct CappedShell {
    inner: Arc<SshShell>,
    cap: Duration,
}

impl NodeShell for CappedShell {
    fn exec<'a>(&'a self, command: &'a str, timeout: Duration) -> ShellFuture<'a> {
        self.inner.exec(command, timeout.min(self.cap))
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(parse_address("h", 22), Ok(("h".into(), 22)));
        assert_eq!(parse_address("h:2200", 22), Ok(("h".into(), 2200)));
        assert_eq!(parse_address("[::1]:7", 22), Ok(("::1".into(), 7)));
        assert_eq!(parse_address("[::1]", 22), Ok(("::1".into(), 22)));
        assert_eq!(parse_address("fe80::1", 22), Ok(("fe80::1".into(), 22)));
        assert!(parse_address("h:x", 22).is_err());
        assert!(parse_address("", 22).is_err());
        assert!(parse_address("[::1", 22).is_err());
    }

    #[test]
    fn settings_are_checked_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let none = NodeAccess::new(&SshSettings::default(), &RedfishSettings::default())
            .expect("defaults: no shell, no auth");
        assert!(none.ssh_permits_available().is_none());

        let key = dir.path().join("missing_key");
        let ssh = SshSettings {
            key_path: Some(key.clone()),
            insecure_accept_any_host_key: true,
            ..SshSettings::default()
        };
        let err = NodeAccess::new(&ssh, &RedfishSettings::default())
            .err()
            .expect("missing key refused");
        assert!(format!("{err:#}").contains("key_path"), "{err:#}");

        let no_policy = SshSettings {
            key_path: Some(key),
            ..SshSettings::default()
        };
        let err = NodeAccess::new(&no_policy, &RedfishSettings::default())
            .err()
            .expect("no host key policy refused");
        assert!(format!("{err:#}").contains("known_hosts"), "{err:#}");

        let session = RedfishSettings {
            auth: RedfishAuthKind::Session,
            user: Some("kiln".into()),
            ..RedfishSettings::default()
        };
        let err = NodeAccess::new(&SshSettings::default(), &session)
            .err()
            .expect("session without password refused");
        assert!(
            format!("{err:#}").contains("needs user and password"),
            "{err:#}"
        );

        let bad_ca = dir.path().join("ca.pem");
        std::fs::write(&bad_ca, "not a certificate").expect("write");
        let tls = RedfishSettings {
            ca_file: Some(bad_ca),
            ..RedfishSettings::default()
        };
        assert!(NodeAccess::new(&SshSettings::default(), &tls).is_err());
    }
}
