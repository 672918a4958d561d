//! How checks run commands on the node. Production uses SSH (a later issue); here are a
//! local shell (for an agent on the node itself, and for tests that need a real process)
//! and a recording (commands mapped to canned output).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

/// Most bytes kept from one stream of one command; the rest is dropped and flagged.
pub const OUTPUT_BYTES_MAX: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommandOutput {
    /// `None` when the command was killed by a signal.
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// True when stdout or stderr was longer than `OUTPUT_BYTES_MAX` and cut.
    pub truncated: bool,
}

impl CommandOutput {
    pub fn ok(stdout: impl Into<String>) -> CommandOutput {
        CommandOutput {
            exit_code: Some(0),
            stdout: stdout.into(),
            stderr: String::new(),
            truncated: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShellError {
    #[error("node unreachable: {0}")]
    Unreachable(String),
    #[error("`{command}` did not finish within {:.1} s and was killed", after.as_secs_f64())]
    Timeout { command: String, after: Duration },
    #[error("could not run `{command}`: {reason}")]
    Spawn { command: String, reason: String },
}

pub type ShellFuture<'a> =
    Pin<Box<dyn Future<Output = Result<CommandOutput, ShellError>> + Send + 'a>>;

/// A shell on the node. `exec` runs one command line under `sh -c` semantics and must
/// kill it (and close whatever channel carried it) when `timeout` passes or when the
/// returned future is dropped.
pub trait NodeShell: Send + Sync {
    fn exec<'a>(&'a self, command: &'a str, timeout: Duration) -> ShellFuture<'a>;
    /// Where commands run, for messages: `local`, `ssh root@gpu-a-01`.
    fn describe(&self) -> String;
}

/// Runs commands on this machine with `sh -c`, each in its own process group so a timeout
/// kills the whole pipeline, not just the shell.
#[derive(Debug, Clone, Default)]
pub struct LocalShell {
    /// Extra environment for every command (tests point `SYSFS_ROOT` at a temp tree).
    pub env: Vec<(String, String)>,
}

impl NodeShell for LocalShell {
    fn exec<'a>(&'a self, command: &'a str, timeout: Duration) -> ShellFuture<'a> {
        Box::pin(async move {
            let mut cmd = Command::new("sh");
            cmd.arg("-c")
                .arg(command)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            for (k, v) in &self.env {
                cmd.env(k, v);
            }
            let mut child = cmd.spawn().map_err(|e| ShellError::Spawn {
                command: command.to_string(),
                reason: e.to_string(),
            })?;
            let pgid = child.id();
            // Kills the group if this future is dropped (deadline) or times out.
            let _guard = GroupKill(pgid);
            let stdout = child.stdout.take();
            let stderr = child.stderr.take();
            let work = async {
                let (out, err) = tokio::join!(read_capped(stdout), read_capped(stderr));
                let status = child.wait().await;
                (out, err, status)
            };
            match tokio::time::timeout(timeout, work).await {
                Ok(((stdout, t1), (stderr, t2), status)) => {
                    let status = status.map_err(|e| ShellError::Spawn {
                        command: command.to_string(),
                        reason: e.to_string(),
                    })?;
                    Ok(CommandOutput {
                        exit_code: status.code(),
                        stdout,
                        stderr,
                        truncated: t1 || t2,
                    })
                }
                Err(_) => Err(ShellError::Timeout {
                    command: command.to_string(),
                    after: timeout,
                }),
            }
        })
    }

    fn describe(&self) -> String {
        "local".into()
    }
}

/// Sends SIGKILL to a process group when dropped (a no-op if it already exited).
struct GroupKill(Option<u32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            // No unsafe here (workspace forbids it), so no kill(2): use kill(1).
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

async fn read_capped<R: AsyncRead + Unpin>(stream: Option<R>) -> (String, bool) {
    let Some(mut stream) = stream else {
        return (String::new(), false);
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut truncated = false;
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = OUTPUT_BYTES_MAX.saturating_sub(buf.len());
                if n > room {
                    truncated = true;
                }
                buf.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
    }
    (String::from_utf8_lossy(&buf).into_owned(), truncated)
}

/// Canned answers: each known command returns its recorded output (after an optional
/// delay); an unknown command is an error that names it.
#[derive(Debug, Clone, Default)]
pub struct RecordedShell {
    answers: HashMap<String, (Result<CommandOutput, ShellError>, Duration)>,
    calls: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl RecordedShell {
    pub fn new() -> RecordedShell {
        RecordedShell::default()
    }

    pub fn answer(mut self, command: &str, output: CommandOutput) -> RecordedShell {
        self.answers
            .insert(command.to_string(), (Ok(output), Duration::ZERO));
        self
    }

    pub fn answer_after(
        mut self,
        command: &str,
        output: Result<CommandOutput, ShellError>,
        delay: Duration,
    ) -> RecordedShell {
        self.answers.insert(command.to_string(), (output, delay));
        self
    }

    /// Every command run so far, in order.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl NodeShell for RecordedShell {
    fn exec<'a>(&'a self, command: &'a str, timeout: Duration) -> ShellFuture<'a> {
        Box::pin(async move {
            self.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(command.to_string());
            let Some((answer, delay)) = self.answers.get(command) else {
                return Err(ShellError::Spawn {
                    command: command.to_string(),
                    reason: "no recorded answer for this command".into(),
                });
            };
            if *delay > timeout {
                tokio::time::sleep(timeout).await;
                return Err(ShellError::Timeout {
                    command: command.to_string(),
                    after: timeout,
                });
            }
            tokio::time::sleep(*delay).await;
            answer.clone()
        })
    }

    fn describe(&self) -> String {
        "recorded".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_shell_captures_output_and_exit_code() {
        let out = LocalShell::default()
            .exec("echo hi; echo err >&2; exit 3", Duration::from_secs(5))
            .await
            .expect("runs");
        assert_eq!(out.stdout, "hi\n");
        assert_eq!(out.stderr, "err\n");
        assert_eq!(out.exit_code, Some(3));
    }

    #[tokio::test]
    async fn local_shell_kills_a_pipeline_on_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("still-running");
        // The background sleep shares the process group; if it survived it would touch
        // the marker after 1.5 s.
        let cmd = format!("(sleep 1.5; touch {}) & sleep 30", marker.display());
        let started = std::time::Instant::now();
        let err = LocalShell::default()
            .exec(&cmd, Duration::from_millis(300))
            .await
            .expect_err("times out");
        assert!(matches!(err, ShellError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(1800)).await;
        assert!(!marker.exists(), "the process group was not killed");
    }
}
