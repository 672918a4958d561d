//! `kiln status` against a seeded SQLite store: the plain (non-terminal) output, `--watch`
//! refreshing until SIGINT, and clear errors for bad input.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_dashboard::seed::{seed_fleet, FleetSpec};
use kiln_store::Store;

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// 40 nodes in racks of 32: rack-0000 holds nodes 0-31, rack-0001 nodes 32-39.
fn seeded_store(dir: &std::path::Path) -> String {
    let url = format!("sqlite://{}", dir.join("kiln.db").display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = Store::connect(&url).await.expect("store");
        seed_fleet(
            &store,
            &FleetSpec {
                nodes: 40,
                rack_size: 32,
                start_ms: 1_714_564_800_000,
            },
        )
        .await
        .expect("seed");
        store.close().await;
    });
    url
}

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(KILN)
        .args(args)
        .env_remove("KILN_DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run kiln")
}

#[test]
fn plain_status_of_a_seeded_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = seeded_store(dir.path());
    let out = kiln(&["status", "--database-url", &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    // Node i ends passed for i % 20 < 12, running 12-13, retrying 14-15, dead 16, queued 17-19.
    let expected = "\
RACK       TOTAL PASSED DEAD_LETTERED RUNNING RETRYING QUEUED FINISHED%
rack-0000     32     24             1       2        2      3      78.1
rack-0001      8      0             1       2        2      3      12.5
TOTAL         40     24             2       4        4      6      65.0
";
    assert_eq!(text, expected, "stdout is not a terminal: plain columns");
    // --plain gives the same at a terminal; here it must not change anything.
    let plain = kiln(&["status", "--plain", "--database-url", &url]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), expected);
}

#[test]
fn watch_refreshes_until_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = seeded_store(dir.path());
    let mut child = Command::new(KILN)
        .args(["status", "--watch", "0.2", "--database-url", &url])
        .env_remove("KILN_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kiln status --watch");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut totals = 0;
    while totals < 3 {
        assert!(Instant::now() < deadline, "fewer than 3 refreshes in 30 s");
        let line = lines.next().expect("more output").expect("read");
        if line.starts_with("TOTAL ") {
            assert!(line.ends_with("65.0"), "{line}");
            totals += 1;
        }
    }
    let pid = child.id().to_string();
    let killed = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill -INT");
    assert!(killed.success());
    let status = child.wait().expect("wait");
    assert!(status.success(), "Ctrl-C ends --watch cleanly: {status:?}");
}

#[test]
fn bad_input_is_refused_with_a_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = seeded_store(dir.path());
    let out = kiln(&["status", "--watch", "0", "--database-url", &url]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refresh interval"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kiln(&["status", "--database-url", "mysql://x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unsupported database URL"));
    // An empty store is not an error; it says what to do.
    let empty = format!("sqlite://{}", dir.path().join("empty.db").display());
    let out = kiln(&["status", "--database-url", &empty]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no racks in the store yet"));
}
