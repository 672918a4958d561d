//! Test and benchmark support: a real `kiln broker` process on a free loopback port with a
//! scratch data directory, stopped (SIGKILL) when dropped. Not for production use.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The `kiln` binary: `$KILN_BIN`, else `kiln` in the target directory the running
/// executable was built into (target/debug/deps/x -> target/debug/kiln).
pub fn kiln_bin() -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("KILN_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("cannot find the running executable")?;
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join("kiln");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "kiln binary not found next to {}: build it with `cargo build -p kiln` or set KILN_BIN",
        exe.display()
    )
}

/// A free TCP port on 127.0.0.1 (free when asked; a race with other processes is possible).
pub fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

pub struct BrokerProcess {
    child: Child,
    pub addr: String,
    log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl BrokerProcess {
    /// Starts `kiln broker` and waits until it accepts connections.
    pub fn start(kiln: &Path) -> anyhow::Result<BrokerProcess> {
        let dir = tempfile::tempdir().context("scratch directory for the broker")?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        let mut command = Command::new(kiln);
        command
            .args(["broker", "--listen", &addr, "--node-id", "0", "--data-dir"])
            .arg(dir.path().join("data"));
        Self::spawn(command, dir, addr)
    }

    /// Starts `kiln broker --config FILE`, the file holding its address, node id 0, data
    /// directory and no metrics listener, then `sections` (TOML tables such as `[tls]`,
    /// `[sasl]`, `[authorization]`), and waits until it accepts connections.
    pub fn start_with_config(kiln: &Path, sections: &str) -> anyhow::Result<BrokerProcess> {
        let dir = tempfile::tempdir().context("scratch directory for the broker")?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        let config = dir.path().join("broker.toml");
        let data_dir = dir.path().join("data");
        if data_dir.display().to_string().contains(['"', '\\']) {
            bail!("{} cannot be a TOML basic string", data_dir.display());
        }
        let text = format!(
            "node_id = 0\nlisten = \"{addr}\"\ndata_dir = \"{}\"\nmetrics_listen = \"off\"\n\n{sections}",
            data_dir.display()
        );
        std::fs::write(&config, text).context("broker config file")?;
        let mut command = Command::new(kiln);
        command.arg("broker").arg("--config").arg(&config);
        Self::spawn(command, dir, addr)
    }

    fn spawn(
        mut command: Command,
        dir: tempfile::TempDir,
        addr: String,
    ) -> anyhow::Result<BrokerProcess> {
        let log_path = dir.path().join("broker.log");
        let log = std::fs::File::create(&log_path).context("broker log file")?;
        let kiln = PathBuf::from(command.get_program());
        let child = command
            .env_remove("KILN_CONFIG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("broker log file")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", kiln.display()))?;
        let mut broker = BrokerProcess {
            child,
            addr,
            log_path,
            _dir: dir,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = broker.child.try_wait()? {
                bail!(
                    "kiln broker exited with {status} before accepting connections\n{}",
                    broker.log_tail()
                );
            }
            if TcpStream::connect(&broker.addr).is_ok() {
                return Ok(broker);
            }
            if Instant::now() > deadline {
                bail!(
                    "kiln broker did not listen on {} within {READY_TIMEOUT:?}\n{}",
                    broker.addr,
                    broker.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The broker's whole log so far (empty if it cannot be read).
    pub fn log_text(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log_path) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    /// The last 8 KiB of the broker's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let start = text.len().saturating_sub(8192);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        format!("--- kiln broker log ---\n{}\n--- end ---", &text[start..])
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
