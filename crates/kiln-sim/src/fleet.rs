//! `Fleet`: starts every simulated node (an SSH server and an HTTPS Redfish endpoint per
//! node, each on its own loopback port), writes what the rest of Kiln needs into the output
//! directory, and stops them all.
//!
//! Files written to `FleetSpec::out_dir`:
//! - `manifest.csv`: the fleet as a rack manifest (`kiln intake register` accepts it);
//! - `agent.toml`: agent settings using everything below (`bootstrap`, `database_url`
//!   and `agent_id` are defaults to edit);
//! - `agent_ed25519` (+ `.pub`): the agent's SSH key; the nodes accept only it, for user
//!   `kiln`;
//! - `known_hosts`: every node's host key, `[127.0.0.1]:PORT` lines;
//! - `ssh-addresses.json`: hostname -> `127.0.0.1:PORT` (`[ssh] addresses_file`);
//! - `bmc-ca.pem`, `bmc-password`: the BMCs' CA and the Redfish password of user `kiln`;
//! - `playbooks/`: the simulated fleet's playbooks (playbooks/sim in the repository);
//! - `fleet.json`: every node with its addresses and injected faults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use kiln_agent::{AgentConfig, RedfishAuthKind, RedfishSettings, SshSettings};
use kiln_manifest::{Format, NodeSpec};
use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::keys::ssh_key::LineEnding;
use russh::keys::PrivateKey;
use serde_json::json;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::bmc::Bmc;
use crate::fixtures::{self, Fixtures};
use crate::node::{SimNode, FIRMWARE_BIOS, FIRMWARE_BMC, FIRMWARE_NIC};
use crate::spec::{Fault, FleetSpec};
use crate::sshd::{self, SshShared};
use crate::stats::{SimStats, StatsSnapshot};
use crate::tls::{self, FleetTls};

/// The user nodes accept over SSH and their BMCs over Redfish.
pub const USER: &str = "kiln";

/// The simulated fleet's playbooks (built in, so the binary needs no repository checkout).
const PLAYBOOKS: [(&str, &str); 3] = [
    (
        "h100-sxm.yaml",
        include_str!("../../../playbooks/sim/h100-sxm.yaml"),
    ),
    (
        "h200-sxm.yaml",
        include_str!("../../../playbooks/sim/h200-sxm.yaml"),
    ),
    (
        "cpu-smoke.yaml",
        include_str!("../../../playbooks/sim/cpu-smoke.yaml"),
    ),
];

pub struct Fleet {
    nodes: Vec<Arc<SimNode>>,
    bmcs: Vec<Arc<Bmc>>,
    out_dir: PathBuf,
    manifest_path: PathBuf,
    agent_config_path: PathBuf,
    playbooks: Vec<PathBuf>,
    ssh: SshSettings,
    redfish: RedfishSettings,
    stats: Arc<SimStats>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The unreachable nodes' ports: bound, never listening, held until the fleet is dropped.
    reserved: Vec<TcpSocket>,
}

/// A loopback port bound without `SO_REUSEADDR` and never listened on: connections to it are
/// refused, and no other socket can be bound to it while this one lives.
fn refusing_port() -> anyhow::Result<TcpSocket> {
    let socket = TcpSocket::new_v4().context("unreachable node's port")?;
    socket
        .bind(([127, 0, 0, 1], 0).into())
        .context("binding an unreachable node's port")?;
    Ok(socket)
}

/// Node `i`'s manifest row.
fn node_row(spec: &FleetSpec, i: usize, bmc_addr: std::net::SocketAddr) -> NodeSpec {
    let model = spec.gpu_model;
    NodeSpec {
        hostname: spec.hostname(i),
        rack: spec.rack(i),
        bmc_address: bmc_addr.to_string(),
        gpu_model: model.label().into(),
        gpu_count: model.gpu_count(),
        firmware_bmc: FIRMWARE_BMC.into(),
        firmware_bios: FIRMWARE_BIOS.into(),
        firmware_gpu_vbios: model.vbios().into(),
        firmware_nic: FIRMWARE_NIC.into(),
        labels: BTreeMap::from([("source".to_string(), "kiln-sim".to_string())]),
    }
}

impl Fleet {
    /// Starts every node of `spec` and writes the output directory. Needs a tokio runtime.
    pub async fn start(spec: FleetSpec) -> anyhow::Result<Fleet> {
        let plan = spec.plan()?;
        let fixtures_dir = fixtures::locate(spec.fixtures.as_deref())?;
        let fixtures = Arc::new(Fixtures::load(&fixtures_dir)?);
        std::fs::create_dir_all(&spec.out_dir)
            .with_context(|| format!("creating {}", spec.out_dir.display()))?;
        let out_dir = spec
            .out_dir
            .canonicalize()
            .with_context(|| spec.out_dir.display().to_string())?;

        let host_key = PrivateKey::from(Ed25519Keypair::from_seed(&rand::random()));
        let agent_key = PrivateKey::from(Ed25519Keypair::from_seed(&rand::random()));
        let tls = FleetTls::generate()?;
        let password = format!("{:032x}", rand::random::<u128>());
        let stats = Arc::new(SimStats::default());
        let ssh_shared = Arc::new(SshShared::new(
            host_key.clone(),
            USER,
            agent_key.public_key().clone(),
            stats.clone(),
        ));
        let (stop, stop_rx) = watch::channel(false);

        let mut nodes = Vec::new();
        let mut bmcs = Vec::new();
        let mut tasks = Vec::new();
        let mut reserved = Vec::new();
        for (i, faults) in plan.into_iter().enumerate() {
            // A node that is powered off or off the network refuses connections: its ports
            // are bound but never listened on, and held for the fleet's lifetime so that no
            // later listener (another node's BMC) is given one of them.
            let (ssh_addr, bmc_addr, listeners) = if faults.contains(&Fault::Unreachable) {
                let (ssh, bmc) = (refusing_port()?, refusing_port()?);
                let addrs = (ssh.local_addr()?, bmc.local_addr()?);
                reserved.extend([ssh, bmc]);
                (addrs.0, addrs.1, None)
            } else {
                let ssh = TcpListener::bind("127.0.0.1:0").await.context("SSH port")?;
                let bmc = TcpListener::bind("127.0.0.1:0").await.context("BMC port")?;
                (ssh.local_addr()?, bmc.local_addr()?, Some((ssh, bmc)))
            };
            let node = Arc::new(SimNode::new(
                node_row(&spec, i, bmc_addr),
                i,
                spec.gpu_model,
                faults,
                ssh_addr,
                bmc_addr,
                fixtures.clone(),
                spec.seed,
            ));
            if let Some((ssh_listener, bmc_listener)) = listeners {
                tasks.push(sshd::serve(
                    ssh_listener,
                    node.clone(),
                    ssh_shared.clone(),
                    stop_rx.clone(),
                ));
                let bmc = Arc::new(Bmc::new(node.clone(), USER, &password, stats.clone()));
                let listener =
                    tls::accept_tls(bmc_listener, tls.acceptor.clone(), stop_rx.clone())?;
                let router = bmc.clone().router();
                let mut stop_serving = stop_rx.clone();
                tasks.push(tokio::spawn(async move {
                    let serving =
                        axum::serve(listener, router).with_graceful_shutdown(async move {
                            let _ = stop_serving.changed().await;
                        });
                    if let Err(e) = serving.await {
                        tracing::warn!(error = %e, "simulated BMC stopped");
                    }
                }));
                bmcs.push(bmc);
            }
            nodes.push(node);
        }

        let mut fleet = Fleet {
            nodes,
            bmcs,
            manifest_path: out_dir.join("manifest.csv"),
            agent_config_path: out_dir.join("agent.toml"),
            out_dir,
            playbooks: Vec::new(),
            ssh: SshSettings::default(),
            redfish: RedfishSettings::default(),
            stats,
            stop,
            tasks,
            reserved,
        };
        fleet.write_files(&host_key, &agent_key, &tls.ca_pem, &password)?;
        Ok(fleet)
    }

    fn write_files(
        &mut self,
        host_key: &PrivateKey,
        agent_key: &PrivateKey,
        ca_pem: &str,
        password: &str,
    ) -> anyhow::Result<()> {
        let dir = self.out_dir.clone();
        let rows: Vec<NodeSpec> = self.nodes.iter().map(|n| n.spec.clone()).collect();
        let csv = kiln_manifest::write(&rows, Format::Csv);
        // The manifest must be one intake accepts; refuse to start otherwise.
        if let Err(e) = kiln_manifest::parse(&csv, Format::Csv, None) {
            bail!("the simulated fleet's manifest is invalid: {e}");
        }
        write(&self.manifest_path, &csv, false)?;

        let key_path = dir.join("agent_ed25519");
        let private = agent_key
            .to_openssh(LineEnding::LF)
            .context("encoding the agent key")?;
        write(&key_path, private.as_str(), true)?;
        let public = agent_key.public_key().to_openssh().context("public key")?;
        write(
            &dir.join("agent_ed25519.pub"),
            &format!("{public}\n"),
            false,
        )?;

        let host_public = host_key.public_key().to_openssh().context("host key")?;
        let mut known_hosts = String::new();
        let mut addresses = BTreeMap::new();
        for n in &self.nodes {
            known_hosts.push_str(&format!(
                "[{}]:{} {host_public}\n",
                n.ssh_addr.ip(),
                n.ssh_addr.port()
            ));
            addresses.insert(n.spec.hostname.clone(), n.ssh_addr.to_string());
        }
        let known_hosts_path = dir.join("known_hosts");
        write(&known_hosts_path, &known_hosts, false)?;
        let addresses_path = dir.join("ssh-addresses.json");
        write(
            &addresses_path,
            &serde_json::to_string_pretty(&addresses)?,
            false,
        )?;
        let ca_path = dir.join("bmc-ca.pem");
        write(&ca_path, ca_pem, false)?;
        let password_path = dir.join("bmc-password");
        write(&password_path, &format!("{password}\n"), true)?;

        let pb_dir = dir.join("playbooks");
        std::fs::create_dir_all(&pb_dir).with_context(|| pb_dir.display().to_string())?;
        for (name, text) in PLAYBOOKS {
            let p = pb_dir.join(name);
            write(&p, text, false)?;
            self.playbooks.push(p);
        }

        self.ssh = SshSettings {
            user: USER.into(),
            key_path: Some(key_path),
            known_hosts: Some(known_hosts_path),
            addresses_file: Some(addresses_path),
            max_sessions: 256,
            connect_timeout_ms: 5_000,
            ..SshSettings::default()
        };
        self.redfish = RedfishSettings {
            auth: RedfishAuthKind::Session,
            user: Some(USER.into()),
            password_file: Some(password_path),
            ca_file: Some(ca_path),
            connect_timeout_ms: 2_000,
            request_timeout_ms: 10_000,
            retries: 1,
            retry_backoff_ms: 200,
            ..RedfishSettings::default()
        };
        write(&self.agent_config_path, &self.agent_toml(), false)?;

        let nodes: Vec<_> = self
            .nodes
            .iter()
            .map(|n| {
                json!({"hostname": n.spec.hostname, "rack": n.spec.rack,
                       "ssh": n.ssh_addr.to_string(), "bmc": format!("https://{}", n.bmc_addr),
                       "faults": n.faults.iter().map(|f| f.to_string()).collect::<Vec<_>>()})
            })
            .collect();
        write(
            &dir.join("fleet.json"),
            &serde_json::to_string_pretty(&json!({ "nodes": nodes }))?,
            false,
        )?;
        Ok(())
    }

    /// A complete agent settings file for this fleet.
    fn agent_toml(&self) -> String {
        let q = |p: &Path| serde_json::Value::from(p.display().to_string()).to_string();
        let opt = |p: &Option<PathBuf>| p.as_deref().map(q).unwrap_or_default();
        let pbs = self
            .playbooks
            .iter()
            .map(|p| q(p))
            .collect::<Vec<_>>()
            .join(", ");
        let (s, r) = (&self.ssh, &self.redfish);
        format!(
            "# Agent settings for the simulated fleet in this directory (written by `kiln sim`).\n\
             bootstrap = \"127.0.0.1:9092\"\n\
             database_url = \"sqlite://kiln.db\"\n\
             agent_id = \"sim-agent\"\n\
             playbooks = [{pbs}]\n\
             metrics_listen = \"off\"\n\n\
             [ssh]\nuser = \"{}\"\nkey_path = {}\nknown_hosts = {}\naddresses_file = {}\n\
             max_sessions = {}\nconnect_timeout_ms = {}\n\n\
             [redfish]\nauth = \"session\"\nuser = \"{USER}\"\npassword_file = {}\nca_file = {}\n\
             connect_timeout_ms = {}\nrequest_timeout_ms = {}\nretries = {}\nretry_backoff_ms = {}\n",
            s.user,
            opt(&s.key_path),
            opt(&s.known_hosts),
            opt(&s.addresses_file),
            s.max_sessions,
            s.connect_timeout_ms,
            opt(&r.password_file),
            opt(&r.ca_file),
            r.connect_timeout_ms,
            r.request_timeout_ms,
            r.retries,
            r.retry_backoff_ms,
        )
    }

    /// The manifest rows, in fleet order.
    pub fn manifest(&self) -> Vec<NodeSpec> {
        self.nodes.iter().map(|n| n.spec.clone()).collect()
    }

    pub fn manifest_path(&self) -> &Path {
        &self.manifest_path
    }

    pub fn agent_config_path(&self) -> &Path {
        &self.agent_config_path
    }

    pub fn out_dir(&self) -> &Path {
        &self.out_dir
    }

    pub fn ssh_settings(&self) -> &SshSettings {
        &self.ssh
    }

    pub fn redfish_settings(&self) -> &RedfishSettings {
        &self.redfish
    }

    /// The simulated fleet's playbooks as written to the output directory.
    pub fn playbooks(&self) -> &[PathBuf] {
        &self.playbooks
    }

    /// `base` with this fleet's playbooks, SSH and Redfish settings.
    pub fn agent_config(&self, base: AgentConfig) -> AgentConfig {
        AgentConfig {
            playbook: None,
            playbooks: self.playbooks.clone(),
            ssh: self.ssh.clone(),
            redfish: self.redfish.clone(),
            ..base
        }
    }

    /// Each node's hostname and faults.
    pub fn faults(&self) -> Vec<(String, Vec<Fault>)> {
        self.nodes
            .iter()
            .map(|n| (n.spec.hostname.clone(), n.faults.clone()))
            .collect()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Redfish sessions open on the BMCs right now.
    pub fn open_redfish_sessions(&self) -> usize {
        self.bmcs.iter().map(|b| b.open_sessions()).sum()
    }

    /// Stops every server and disconnects open connections.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for mut t in self.tasks {
            if tokio::time::timeout(Duration::from_secs(5), &mut t)
                .await
                .is_err()
            {
                t.abort();
            }
        }
        // The unreachable nodes' ports are given back last, once nothing serves any node.
        drop(self.reserved);
    }
}

fn write(path: &Path, text: &str, private: bool) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod 600 {}", path.display()))?;
    }
    Ok(())
}
