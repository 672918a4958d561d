//! `SshShell` against a real OpenSSH server: each test starts `/usr/sbin/sshd -D` on a free
//! loopback port with a throwaway host key and authorized_keys (as root, as CI runs), and
//! kills it at the end. Since the server is this machine, a test can see on the file system
//! whether a timed-out remote command was really killed.
//!
//! Env: KILN_SSHD (default /usr/sbin/sshd, from Debian's openssh-server, installed by
//! scripts/install-test-deps); KILN_ALLOW_NO_SSHD=1 skips instead of failing without it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_checks::ssh::{HostKeyPolicy, SshConfig, SshShell};
use kiln_checks::{
    run_check, Check, CheckContext, CheckFuture, CheckResult, NodeShell, Playbook, ShellError,
    Verdict,
};

struct Sshd {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "kiln-test", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen (openssh-client)");
    assert!(
        out.status.success(),
        "ssh-keygen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Ports handed to this process's sshd instances.
static PORTS_TAKEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A port no other test of this binary was given: tests run in parallel threads, and two that
/// drew the same port would find each other's sshd listening, and one would lose it when the
/// other ends.
fn free_port() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let mut taken = PORTS_TAKEN.lock().unwrap_or_else(|p| p.into_inner());
        if taken.insert(port) {
            return port;
        }
    }
}

/// Waits until the sshd `child` answers on `port` with its banner (a connection alone could
/// reach some other socket that took the port); false if it exited first.
fn wait_listening(child: &mut std::process::Child, port: u16) -> bool {
    use std::io::Read;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
            let mut banner = [0u8; 4];
            if stream.read_exact(&mut banner).is_ok() && &banner == b"SSH-" {
                return true;
            }
        }
        assert!(Instant::now() < deadline, "sshd did not listen within 10 s");
        std::thread::sleep(Duration::from_millis(25));
    }
}

impl Sshd {
    fn start() -> Option<Sshd> {
        let bin = std::env::var_os("KILN_SSHD")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/sbin/sshd"));
        if !bin.exists() {
            if std::env::var("KILN_ALLOW_NO_SSHD").as_deref() == Ok("1") {
                eprintln!(
                    "SKIPPED: no sshd at {} (KILN_ALLOW_NO_SSHD=1)",
                    bin.display()
                );
                return None;
            }
            panic!(
                "no sshd at {}: run scripts/install-test-deps (Debian openssh-server), or set \
                 KILN_SSHD, or KILN_ALLOW_NO_SSHD=1 to skip",
                bin.display()
            );
        }
        // sshd refuses to start without its privilege separation directory.
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd (tests run as root)");
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |n: &str| dir.path().join(n);
        keygen(&p("host_key"));
        keygen(&p("client_key"));
        std::fs::copy(p("client_key.pub"), p("authorized_keys")).expect("authorized_keys");
        // sshd may lose its port before it binds (another thread's probe for a free port can
        // be handed the same one): then it exits, and it is started again on another port.
        for _attempt in 0..5 {
            let port = free_port();
            let config = format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile {}\nAuthorizedKeysFile {}\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                 PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nMaxSessions 20\n\
                 MaxStartups 50\nLogLevel ERROR\n",
                p("host_key").display(),
                p("sshd.pid").display(),
                p("authorized_keys").display()
            );
            std::fs::write(p("sshd_config"), config).expect("config");
            let child = Command::new(&bin)
                .args(["-D", "-e", "-f"])
                .arg(p("sshd_config"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(p("sshd.log")).expect("log"))
                .spawn()
                .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
            let mut child = child;
            if wait_listening(&mut child, port) {
                return Some(Sshd { child, port, dir });
            }
            let _ = child.wait();
            eprintln!(
                "sshd on port {port} exited before serving ({}); trying another port",
                std::fs::read_to_string(p("sshd.log"))
                    .unwrap_or_default()
                    .trim()
            );
        }
        panic!("sshd did not start on any of five ports");
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A known_hosts file holding this server's host key (`[127.0.0.1]:port`).
    fn known_hosts(&self) -> PathBuf {
        let key = std::fs::read_to_string(self.path("host_key.pub")).expect("host key");
        let mut parts = key.split_whitespace();
        let line = format!(
            "[127.0.0.1]:{} {} {}\n",
            self.port,
            parts.next().expect("alg"),
            parts.next().expect("key")
        );
        let path = self.path("known_hosts");
        std::fs::write(&path, line).expect("known_hosts");
        path
    }

    fn config(&self, host_keys: HostKeyPolicy) -> SshConfig {
        let mut cfg = SshConfig::new("127.0.0.1", "root", self.path("client_key"), host_keys);
        cfg.port = self.port;
        cfg.connect_timeout = Duration::from_secs(5);
        cfg
    }

    fn shell(&self) -> SshShell {
        SshShell::new(self.config(HostKeyPolicy::KnownHosts(self.known_hosts())))
            .expect("key loads")
    }
}

#[tokio::test]
async fn runs_commands_with_output_and_exit_code() {
    let Some(sshd) = Sshd::start() else { return };
    let sh = sshd.shell();
    let out = sh
        .exec(
            "echo out; echo 'it''s' >&2; exit 7",
            Duration::from_secs(10),
        )
        .await
        .expect("runs");
    assert_eq!(out.stdout, "out\n");
    assert_eq!(out.stderr, "its\n", "the pgid marker is stripped");
    assert_eq!(out.exit_code, Some(7));
    // The connection is reused for the next command.
    let out = sh
        .exec("printf '%s' \"$((6*7))\"", Duration::from_secs(10))
        .await
        .expect("runs");
    assert_eq!(out.stdout, "42");
    assert_eq!(sh.describe(), format!("ssh root@127.0.0.1:{}", sshd.port));
    sh.disconnect().await;
    let out = sh
        .exec("true", Duration::from_secs(10))
        .await
        .expect("reconnects");
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn host_keys_are_verified_unless_explicitly_not() {
    let Some(sshd) = Sshd::start() else { return };
    // A known_hosts without this server.
    let empty = sshd.path("empty_known_hosts");
    std::fs::write(&empty, "").expect("write");
    let sh = SshShell::new(sshd.config(HostKeyPolicy::KnownHosts(empty.clone()))).expect("key");
    let e = sh
        .exec("true", Duration::from_secs(10))
        .await
        .expect_err("unknown host");
    assert!(matches!(e, ShellError::Unreachable(_)), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("[127.0.0.1]:{} is not in", sshd.port)),
        "{e}"
    );

    // The right algorithm but another key: a changed host key.
    keygen(&sshd.path("other_key"));
    let other = std::fs::read_to_string(sshd.path("other_key.pub")).expect("key");
    let mut parts = other.split_whitespace();
    std::fs::write(
        &empty,
        format!(
            "[127.0.0.1]:{} {} {}\n",
            sshd.port,
            parts.next().expect("alg"),
            parts.next().expect("key")
        ),
    )
    .expect("write");
    let sh = SshShell::new(sshd.config(HostKeyPolicy::KnownHosts(empty))).expect("key");
    let e = sh
        .exec("true", Duration::from_secs(10))
        .await
        .expect_err("changed key");
    assert!(e.to_string().contains("CHANGED"), "{e}");

    let sh = SshShell::new(sshd.config(HostKeyPolicy::InsecureAcceptAny)).expect("key");
    assert_eq!(
        sh.exec("true", Duration::from_secs(10))
            .await
            .expect("opt-out")
            .exit_code,
        Some(0)
    );
}

#[tokio::test]
async fn a_key_the_server_does_not_know_is_refused() {
    let Some(sshd) = Sshd::start() else { return };
    keygen(&sshd.path("stranger"));
    let mut cfg = sshd.config(HostKeyPolicy::KnownHosts(sshd.known_hosts()));
    cfg.key_path = sshd.path("stranger");
    let e = SshShell::new(cfg)
        .expect("key")
        .exec("true", Duration::from_secs(10))
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("refused for user root"), "{e}");
    let mut cfg = sshd.config(HostKeyPolicy::InsecureAcceptAny);
    cfg.key_path = sshd.path("no-such-key");
    assert!(SshShell::new(cfg).is_err());
}

#[tokio::test]
async fn a_timed_out_command_is_killed_on_the_node() {
    let Some(sshd) = Sshd::start() else { return };
    let sh = sshd.shell();
    let marker = sshd.path("survived");
    let child_marker = sshd.path("child-survived");
    let cmd = format!(
        "(sleep 2.5; touch {}) & sleep 2.5; touch {}",
        child_marker.display(),
        marker.display()
    );
    let started = Instant::now();
    let e = sh
        .exec(&cmd, Duration::from_millis(500))
        .await
        .expect_err("times out");
    assert!(matches!(e, ShellError::Timeout { .. }), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(!marker.exists(), "the remote command survived its timeout");
    assert!(
        !child_marker.exists(),
        "a background child of the remote command survived"
    );
    // The connection still works after the kill.
    assert_eq!(
        sh.exec("echo ok", Duration::from_secs(5))
            .await
            .expect("runs")
            .stdout,
        "ok\n"
    );
}

/// A check that waits on its command far longer than the step may run.
struct Patient(String);

impl Check for Patient {
    fn name(&self) -> &str {
        "patient"
    }
    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        Box::pin(async move {
            let r = ctx
                .shell
                .as_ref()
                .expect("shell")
                .exec(&self.0, Duration::from_secs(60))
                .await;
            CheckResult::pass("patient", format!("{r:?}"))
        })
    }
}

#[tokio::test]
async fn a_dropped_check_kills_its_remote_command() {
    let Some(sshd) = Sshd::start() else { return };
    let marker = sshd.path("survived");
    let ctx = CheckContext::new(
        common::node(0),
        tokio::time::Instant::now() + Duration::from_secs(60),
    )
    .with_shell(Arc::new(sshd.shell()));
    // The kill travels over a fresh SSH exchange after the drop; on a loaded machine that can
    // take a few seconds, so the command sleeps long enough to tell "killed" from "slow kill".
    let check = Patient(format!("sleep 6; touch {}", marker.display()));
    // run_check drops the check's future at the step timeout, mid-command.
    let r = run_check(&check, &ctx, Some(Duration::from_millis(500))).await;
    assert_eq!(r.verdict, Verdict::Error);
    assert!(
        r.message
            .contains("did not finish within 0.5 s (its timeout)"),
        "{}",
        r.message
    );
    tokio::time::sleep(Duration::from_millis(6500)).await;
    assert!(
        !marker.exists(),
        "the remote command outlived the dropped check"
    );
}

#[tokio::test]
async fn concurrent_commands_are_bounded() {
    let Some(sshd) = Sshd::start() else { return };
    let mut cfg = sshd.config(HostKeyPolicy::KnownHosts(sshd.known_hosts()));
    cfg.sessions_max = 2;
    let sh = Arc::new(SshShell::new(cfg).expect("key"));
    // Warm the connection so the timing below is about sessions only.
    sh.exec("true", Duration::from_secs(5)).await.expect("runs");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let sh = sh.clone();
        tasks.push(tokio::spawn(async move {
            sh.exec("sleep 0.4", Duration::from_secs(10)).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("joins").expect("runs").exit_code, Some(0));
    }
    let took = started.elapsed();
    // 4 commands of 0.4 s, 2 at a time: two rounds.
    assert!(
        took >= Duration::from_millis(800),
        "ran more than 2 at once: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test]
async fn infiniband_check_over_real_ssh() {
    let Some(sshd) = Sshd::start() else { return };
    // The stuck-port snapshot, laid out as a sysfs tree the remote shell reads.
    let snap: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::fixtures().join("sysfs/learn_stuck_ib_intf.json"))
            .expect("fixture"),
    )
    .expect("json");
    let root = sshd.path("sys");
    for (path, content) in snap.as_object().expect("map") {
        let dest = root.join(path.strip_prefix("/sys/").expect("sysfs path"));
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::write(dest, content.as_str().expect("text")).expect("write");
    }
    let p = Playbook::parse(&format!(
        "playbook: t\nchecks:\n - check: infiniband\n   hca_count: 8\n   rate_gbps: 200\n   sysfs_root: {}\n",
        root.display()
    ))
    .expect("valid");
    let ctx = CheckContext::new(
        common::node(8),
        tokio::time::Instant::now() + Duration::from_secs(20),
    )
    .with_shell(Arc::new(sshd.shell()));
    let run = p.run(&ctx).await;
    let r = &run.results[0];
    assert_eq!(r.verdict, Verdict::Fail, "{}", r.message);
    assert_eq!(
        r.message,
        "mlx5_6 port 1: state \"2: INIT\", expected ACTIVE (link up, but the subnet manager has not configured the port); mlx5_8 port 1: state \"2: INIT\", expected ACTIVE (link up, but the subnet manager has not configured the port)"
    );
}
