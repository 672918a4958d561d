//! `SshShell`: the node's shell over SSH (russh), the `NodeShell` burn-in agents use.
//!
//! - One connection per node, opened on first use and again if it drops; each command is
//!   a channel on it, and at most `sessions_max` run at once (a semaphore: OpenSSH's
//!   `MaxSessions` is 10 by default, and a node should not be flooded).
//! - The server's host key is checked against a known_hosts file (`[host]:port` entries for
//!   a non-22 port), or accepted blindly only by the explicit `InsecureAcceptAny` opt-out.
//! - Public-key authentication with an OpenSSH private key file.
//! - Every command runs in its own session and process group on the node
//!   (`setsid -w sh -c ...`, which reports its process group id on stderr first). When the
//!   command's timeout passes, or the future running it is dropped (the check's deadline),
//!   the whole group is killed with `kill -KILL -- -<pgid>` over a second channel, and the
//!   channel is closed. Closing a channel alone would not stop a command that never
//!   writes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use russh::client::{self, Handle};
use russh::keys::{self, PrivateKey, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::{ChannelMsg, Disconnect};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};

use crate::shell::{CommandOutput, NodeShell, ShellError, ShellFuture, OUTPUT_BYTES_MAX};

/// How the server's host key is trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyPolicy {
    /// Only a key recorded for this host (and port) in this known_hosts file.
    KnownHosts(PathBuf),
    /// Any key: an explicit opt-out, for labs. The node is not authenticated.
    InsecureAcceptAny,
}

#[derive(Debug, Clone)]
pub struct SshConfig {
    pub host: String,
    pub port: u16,
    pub user: String,
    /// OpenSSH private key file (unencrypted; the agent's deploy key).
    pub key_path: PathBuf,
    pub host_keys: HostKeyPolicy,
    pub connect_timeout: Duration,
    /// Most commands running at once on this node.
    pub sessions_max: usize,
    /// Keepalive interval; the connection is dropped after 3 unanswered.
    pub keepalive: Duration,
}

impl SshConfig {
    pub fn new(host: &str, user: &str, key_path: PathBuf, host_keys: HostKeyPolicy) -> SshConfig {
        SshConfig {
            host: host.to_string(),
            port: 22,
            user: user.to_string(),
            key_path,
            host_keys,
            connect_timeout: Duration::from_secs(10),
            sessions_max: 4,
            keepalive: Duration::from_secs(15),
        }
    }
}

/// Checks the server key; remembers why it refused one, for the error message.
struct Client {
    host: String,
    port: u16,
    policy: HostKeyPolicy,
    refused: Arc<StdMutex<Option<String>>>,
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let path = match &self.policy {
            HostKeyPolicy::InsecureAcceptAny => return Ok(true),
            HostKeyPolicy::KnownHosts(path) => path,
        };
        let PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            self.refuse("the server offered a host certificate; only known_hosts keys are trusted");
            return Ok(false);
        };
        let fingerprint = key.fingerprint(Default::default());
        match keys::check_known_hosts_path(&self.host, self.port, key, path) {
            Ok(true) => Ok(true),
            Ok(false) => {
                self.refuse(&format!(
                    "host key {fingerprint} of [{}]:{} is not in {}",
                    self.host,
                    self.port,
                    path.display()
                ));
                Ok(false)
            }
            Err(keys::Error::KeyChanged { line }) => {
                self.refuse(&format!(
                    "host key of [{}]:{} CHANGED: now {fingerprint}, {} line {line} has another",
                    self.host,
                    self.port,
                    path.display()
                ));
                Ok(false)
            }
            Err(e) => {
                self.refuse(&format!("cannot check {}: {e}", path.display()));
                Ok(false)
            }
        }
    }
}

impl Client {
    fn refuse(&self, why: &str) {
        *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
    }
}

pub struct SshShell {
    cfg: SshConfig,
    key: Arc<PrivateKey>,
    conn: Mutex<Option<Arc<Handle<Client>>>>,
    sessions: Arc<Semaphore>,
    /// Remote kills still being sent; `disconnect` waits for them, or closing the
    /// connection first would leave the timed-out command running on the node.
    kills: Arc<AtomicUsize>,
}

impl SshShell {
    /// Loads the key now, so a bad key file is reported before any node is touched.
    pub fn new(cfg: SshConfig) -> Result<SshShell, ShellError> {
        let key = keys::load_secret_key(&cfg.key_path, None).map_err(|e| {
            ShellError::Unreachable(format!("SSH key {}: {e}", cfg.key_path.display()))
        })?;
        let sessions = Arc::new(Semaphore::new(cfg.sessions_max.max(1)));
        Ok(SshShell {
            cfg,
            key: Arc::new(key),
            conn: Mutex::new(None),
            sessions,
            kills: Arc::new(AtomicUsize::new(0)),
        })
    }

    fn target(&self) -> String {
        format!("{}@{}:{}", self.cfg.user, self.cfg.host, self.cfg.port)
    }

    /// The open connection, or a new one (connect, host key, authenticate).
    async fn connection(&self) -> Result<Arc<Handle<Client>>, ShellError> {
        let mut slot = self.conn.lock().await;
        if let Some(h) = slot.as_ref() {
            if !h.is_closed() {
                return Ok(h.clone());
            }
        }
        let refused = Arc::new(StdMutex::new(None));
        let handler = Client {
            host: self.cfg.host.clone(),
            port: self.cfg.port,
            policy: self.cfg.host_keys.clone(),
            refused: refused.clone(),
        };
        let config = Arc::new(client::Config {
            keepalive_interval: Some(self.cfg.keepalive),
            keepalive_max: 3,
            nodelay: true,
            ..Default::default()
        });
        let unreachable =
            |what: String| ShellError::Unreachable(format!("ssh {}: {what}", self.target()));
        let connect = client::connect(config, (self.cfg.host.as_str(), self.cfg.port), handler);
        let mut handle = match tokio::time::timeout(self.cfg.connect_timeout, connect).await {
            Err(_) => {
                return Err(unreachable(format!(
                    "no connection within {} s",
                    self.cfg.connect_timeout.as_secs_f64()
                )))
            }
            Ok(Err(e)) => {
                let why = refused.lock().unwrap_or_else(|p| p.into_inner()).take();
                return Err(unreachable(why.unwrap_or_else(|| e.to_string())));
            }
            Ok(Ok(h)) => h,
        };
        let hash = if self.key.algorithm().is_rsa() {
            handle
                .best_supported_rsa_hash()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .flatten()
        } else {
            None
        };
        let auth = tokio::time::timeout(
            self.cfg.connect_timeout,
            handle.authenticate_publickey(
                &self.cfg.user,
                PrivateKeyWithHashAlg::new(self.key.clone(), hash),
            ),
        )
        .await
        .map_err(|_| unreachable("authentication timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
        if !auth.success() {
            return Err(unreachable(format!(
                "public key {} refused for user {}",
                self.cfg.key_path.display(),
                self.cfg.user
            )));
        }
        let h = Arc::new(handle);
        *slot = Some(h.clone());
        Ok(h)
    }

    /// Closes the connection (the next command opens a new one), after any remote kill of
    /// a timed-out command has been sent (each is bounded at 10 s).
    pub async fn disconnect(&self) {
        let until = tokio::time::Instant::now() + Duration::from_secs(11);
        while self.kills.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(h) = self.conn.lock().await.take() {
            let _ = h.disconnect(Disconnect::ByApplication, "", "en").await;
        }
    }

    async fn run(
        &self,
        command: &str,
        _permit: OwnedSemaphorePermit,
    ) -> Result<CommandOutput, ShellError> {
        let handle = self.connection().await?;
        let channel = handle
            .channel_open_session()
            .await
            .map_err(|e| ShellError::Spawn {
                command: command.to_string(),
                reason: format!("ssh {}: open channel: {e}", self.target()),
            })?;
        // From the exec on, the command may be running: until its process group id arrives,
        // the guard holds the channel, so a timeout in this window still finds and kills it.
        let mut guard = RemoteKill {
            handle: handle.clone(),
            pgid: None,
            unmarked: Some((channel, Vec::new())),
            marked: None,
            armed: true,
            kills: self.kills.clone(),
        };
        if let Some((channel, _)) = guard.unmarked.as_mut() {
            channel
                .exec(true, wrap(command))
                .await
                .map_err(|e| ShellError::Spawn {
                    command: command.to_string(),
                    reason: format!("ssh {}: exec: {e}", self.target()),
                })?;
        }
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut truncated = false;
        let mut exit_code = None;
        let mut marker_done = false;
        loop {
            let msg = match (&mut guard.unmarked, &mut guard.marked) {
                (Some((channel, _)), _) | (None, Some(channel)) => channel.wait().await,
                (None, None) => unreachable!("the channel is in the guard until the end"),
            };
            let Some(msg) = msg else { break };
            match msg {
                ChannelMsg::Data { data } => push_capped(&mut stdout, &data, &mut truncated),
                ChannelMsg::ExtendedData { data, ext: 1 } => {
                    push_capped(&mut stderr, &data, &mut truncated);
                    if !marker_done {
                        if let Some((_, seen)) = guard.unmarked.as_mut() {
                            seen.clone_from(&stderr);
                        }
                        if let Some((pgid, rest)) = take_marker(&stderr) {
                            guard.pgid = Some(pgid);
                            guard.marked = guard.unmarked.take().map(|(c, _)| c);
                            stderr = rest;
                            marker_done = true;
                        }
                    }
                }
                ChannelMsg::ExitStatus { exit_status } => {
                    exit_code = Some(i32::try_from(exit_status).unwrap_or(i32::MAX))
                }
                ChannelMsg::ExitSignal { .. } => exit_code = None,
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        guard.armed = false;
        if let Some(channel) = guard
            .marked
            .take()
            .or_else(|| guard.unmarked.take().map(|(c, _)| c))
        {
            let _ = channel.close().await;
        }
        Ok(CommandOutput {
            exit_code,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            truncated,
        })
    }
}

impl NodeShell for SshShell {
    fn exec<'a>(&'a self, command: &'a str, timeout: Duration) -> ShellFuture<'a> {
        Box::pin(async move {
            let work =
                async {
                    let permit = self.sessions.clone().acquire_owned().await.map_err(|e| {
                        ShellError::Spawn {
                            command: command.to_string(),
                            reason: e.to_string(),
                        }
                    })?;
                    self.run(command, permit).await
                };
            // On timeout `work` is dropped: its RemoteKill guard kills the remote group.
            tokio::time::timeout(timeout, work)
                .await
                .unwrap_or_else(|_| {
                    Err(ShellError::Timeout {
                        command: command.to_string(),
                        after: timeout,
                    })
                })
        })
    }

    fn describe(&self) -> String {
        format!("ssh {}", self.target())
    }
}

const MARKER: &str = "kiln-pgid=";

/// `setsid -w` puts the command in a new session and process group (pid == pgid), and
/// waits for it so the exit status comes back; the inner shell prints its pid first.
fn wrap(command: &str) -> String {
    let quoted = format!("'{}'", command.replace('\'', "'\\''"));
    format!(
        "exec setsid -w sh -c 'printf \"{MARKER}%s\\n\" \"$$\" >&2; exec sh -c \"$1\"' kiln {quoted}"
    )
}

/// Splits `kiln-pgid=1234\n` off the start of stderr, once the whole line is there.
fn take_marker(stderr: &[u8]) -> Option<(u32, Vec<u8>)> {
    let text = std::str::from_utf8(stderr).ok()?;
    let rest = text.strip_prefix(MARKER)?;
    let (num, after) = rest.split_once('\n')?;
    Some((num.trim().parse().ok()?, after.as_bytes().to_vec()))
}

fn push_capped(buf: &mut Vec<u8>, data: &[u8], truncated: &mut bool) {
    let room = OUTPUT_BYTES_MAX.saturating_sub(buf.len());
    if data.len() > room {
        *truncated = true;
    }
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

/// Kills the remote process group unless disarmed (the command finished on its own).
/// Runs from `Drop`, so it spawns: the command's future may be dropped by a deadline.
///
/// The channel lives here: `unmarked` (with the stderr read so far) until the command's
/// process group id has arrived, `marked` after. A guard dropped before the id arrived (a
/// timeout shorter than the node takes to start the command) reads on for it in the
/// background, up to `MARKER_WAIT`, then kills.
struct RemoteKill {
    handle: Arc<Handle<Client>>,
    pgid: Option<u32>,
    unmarked: Option<(russh::Channel<client::Msg>, Vec<u8>)>,
    marked: Option<russh::Channel<client::Msg>>,
    armed: bool,
    kills: Arc<AtomicUsize>,
}

/// Longest a dropped command's process group id is waited for before giving up on killing it
/// (logged): the node did not start it in that time, or its stderr is not ours.
const MARKER_WAIT: Duration = Duration::from_secs(10);

/// Reads `channel` until its stderr starts with the marker line; `None` if it closes first
/// or `MARKER_WAIT` passes.
async fn read_marker(
    mut channel: russh::Channel<client::Msg>,
    mut seen: Vec<u8>,
) -> Option<(u32, russh::Channel<client::Msg>)> {
    let read = async {
        loop {
            if let Some((pgid, _)) = take_marker(&seen) {
                return Some(pgid);
            }
            match channel.wait().await? {
                ChannelMsg::ExtendedData { data, ext: 1 } => {
                    let mut truncated = false;
                    push_capped(&mut seen, &data, &mut truncated);
                }
                ChannelMsg::Close | ChannelMsg::Eof => return None,
                _ => {}
            }
        }
    };
    let pgid = tokio::time::timeout(MARKER_WAIT, read)
        .await
        .ok()
        .flatten()?;
    Some((pgid, channel))
}

impl Drop for RemoteKill {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let known = self.pgid;
        let unmarked = self.unmarked.take();
        if known.is_none() && unmarked.is_none() {
            return;
        }
        let handle = self.handle.clone();
        let kills = self.kills.clone();
        kills.fetch_add(1, Ordering::SeqCst);
        rt.spawn(async move {
            let pgid = match (known, unmarked) {
                (Some(pgid), _) => pgid,
                (None, Some((channel, seen))) => match read_marker(channel, seen).await {
                    Some((pgid, channel)) => {
                        let _ = channel.close().await;
                        pgid
                    }
                    None => {
                        tracing::debug!(
                            "a timed-out remote command never started (no process group id)"
                        );
                        kills.fetch_sub(1, Ordering::SeqCst);
                        return;
                    }
                },
                (None, None) => unreachable!("checked before spawning"),
            };
            let kill = async {
                let ch = handle.channel_open_session().await?;
                ch.exec(true, format!("kill -KILL -- -{pgid}")).await?;
                let mut ch = ch;
                while let Some(msg) = ch.wait().await {
                    if matches!(msg, ChannelMsg::Close) {
                        break;
                    }
                }
                let _ = ch.close().await;
                Ok::<(), russh::Error>(())
            };
            if let Err(e) = tokio::time::timeout(Duration::from_secs(10), kill).await {
                tracing::warn!(pgid, "killing a timed-out remote command: {e}");
            }
            kills.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_quotes_any_command() {
        let w = wrap("echo 'it''s' \"x\" $HOME");
        assert!(
            w.ends_with("kiln 'echo '\\''it'\\'''\\''s'\\'' \"x\" $HOME'"),
            "{w}"
        );
        let (pgid, rest) = take_marker(b"kiln-pgid=4242\nreal stderr\n").expect("marker");
        assert_eq!((pgid, rest.as_slice()), (4242, &b"real stderr\n"[..]));
        assert!(take_marker(b"kiln-pgid=42").is_none(), "incomplete line");
    }
}
