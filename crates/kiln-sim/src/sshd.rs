//! A simulated node's SSH server (russh): public-key authentication for one user and one
//! key (the agent's), one `exec` per channel answered by `commands::respond`, and the agent's
//! process-group protocol — a wrapped command reports a process group id on stderr first,
//! and `kill -KILL -- -PGID` on another channel stops it (a hung stress command ends only
//! that way, or when its channel or connection closes).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::keys::{PrivateKey, PublicKey};
use russh::server::{self, Auth, ChannelOpenHandle, Handle, Msg, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, Disconnect};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::commands::{self, Reply};
use crate::node::SimNode;
use crate::stats::SimStats;

/// What every node's server shares: the host key, who may log in, the counters.
pub struct SshShared {
    pub config: Arc<server::Config>,
    pub user: String,
    pub authorized: PublicKey,
    pub stats: Arc<SimStats>,
}

impl SshShared {
    pub fn new(
        host_key: PrivateKey,
        user: &str,
        authorized: PublicKey,
        stats: Arc<SimStats>,
    ) -> SshShared {
        let config = server::Config {
            keys: vec![host_key],
            inactivity_timeout: Some(Duration::from_secs(600)),
            auth_rejection_time: Duration::from_millis(100),
            auth_rejection_time_initial: Some(Duration::ZERO),
            nodelay: true,
            ..Default::default()
        };
        SshShared {
            config: Arc::new(config),
            user: user.into(),
            authorized,
            stats,
        }
    }
}

/// Serves `node` on `listener` until `stop` changes; open connections are then disconnected.
pub fn serve(
    listener: TcpListener,
    node: Arc<SimNode>,
    shared: Arc<SshShared>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stop_accept = stop.clone();
        loop {
            let tcp = tokio::select! {
                _ = stop_accept.changed() => return,
                r = listener.accept() => match r {
                    Ok((tcp, _)) => tcp,
                    Err(e) => {
                        tracing::warn!(host = node.hostname(), error = %e, "simulated sshd: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let conn = Conn::new(node.clone(), shared.clone());
            let config = shared.config.clone();
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let session = match server::run_stream(config, tcp, conn).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!(error = %e, "simulated sshd: connection setup failed");
                        return;
                    }
                };
                let handle = session.handle();
                tokio::select! {
                    _ = session => {}
                    _ = stop.changed() => {
                        let _ = handle
                            .disconnect(Disconnect::ByApplication, "fleet stopping".into(), "en".into())
                            .await;
                    }
                }
            });
        }
    })
}

type Jobs = Arc<Mutex<HashMap<u32, (ChannelId, AbortHandle)>>>;

/// One connection (one agent run).
struct Conn {
    node: Arc<SimNode>,
    shared: Arc<SshShared>,
    /// This run shows the node's intermittent fault.
    flaky: bool,
    /// Wrapped commands still running, by process group id.
    jobs: Jobs,
    by_channel: HashMap<ChannelId, AbortHandle>,
}

impl Conn {
    fn new(node: Arc<SimNode>, shared: Arc<SshShared>) -> Conn {
        shared.stats.ssh_opened();
        let flaky = node.begin_run();
        Conn {
            node,
            shared,
            flaky,
            jobs: Arc::new(Mutex::new(HashMap::new())),
            by_channel: HashMap::new(),
        }
    }

    fn key_ok(&self, user: &str, key: &PublicKey) -> bool {
        user == self.shared.user && key.key_data() == self.shared.authorized.key_data()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        for job in self.by_channel.values() {
            job.abort();
        }
        self.shared.stats.ssh_closed();
    }
}

impl server::Handler for Conn {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: server::PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(if self.key_ok(user, offer.public_key) {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(if self.key_ok(user, key.public_key) {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }

    async fn channel_open_session(
        &mut self,
        _channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        reply.accept().await;
        Ok(())
    }

    async fn channel_close(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(job) = self.by_channel.remove(&channel) {
            job.abort();
        }
        Ok(())
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)?;
        let text = String::from_utf8_lossy(data);
        let (command, wrapped) = commands::unwrap_command(&text);
        self.shared.stats.command();
        let handle = session.handle();
        let reply = match commands::respond(&self.node, &command, self.flaky) {
            Reply::Kill(pgid) => {
                let target = self
                    .jobs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&pgid);
                match target {
                    Some((ch, job)) => {
                        job.abort();
                        self.shared.stats.kill();
                        let h = handle.clone();
                        tokio::spawn(async move { finish(&h, ch, 137).await });
                        Reply::Output {
                            stdout: String::new(),
                            stderr: String::new(),
                            code: 0,
                        }
                    }
                    None => Reply::Output {
                        stdout: String::new(),
                        stderr: format!("sh: 1: kill: No such process -{pgid}\n"),
                        code: 1,
                    },
                }
            }
            other => other,
        };
        let pgid = wrapped.then(|| self.node.next_pgid.fetch_add(1, Ordering::Relaxed));
        let jobs = self.jobs.clone();
        let task = tokio::spawn(async move {
            run_job(&handle, channel, pgid, reply).await;
            if let Some(p) = pgid {
                jobs.lock().unwrap_or_else(|e| e.into_inner()).remove(&p);
            }
        });
        if let Some(p) = pgid {
            self.jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(p, (channel, task.abort_handle()));
        }
        self.by_channel.insert(channel, task.abort_handle());
        Ok(())
    }
}

async fn run_job(handle: &Handle, ch: ChannelId, pgid: Option<u32>, reply: Reply) {
    if let Some(p) = pgid {
        let _ = handle
            .extended_data(ch, 1, format!("kiln-pgid={p}\n").into_bytes())
            .await;
    }
    match reply {
        Reply::Hang => std::future::pending::<()>().await,
        Reply::Output {
            stdout,
            stderr,
            code,
        } => {
            if !stdout.is_empty() {
                let _ = handle.data(ch, stdout.into_bytes()).await;
            }
            if !stderr.is_empty() {
                let _ = handle.extended_data(ch, 1, stderr.into_bytes()).await;
            }
            finish(handle, ch, code).await;
        }
        Reply::Kill(_) => finish(handle, ch, 1).await,
    }
}

async fn finish(handle: &Handle, ch: ChannelId, code: u32) {
    let _ = handle.exit_status_request(ch, code).await;
    let _ = handle.eof(ch).await;
    let _ = handle.close(ch).await;
}
