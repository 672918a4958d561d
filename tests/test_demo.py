"""`kiln demo`: the whole job in one process. It must reach its summary with every injected
permanent fault dead-lettered on the check that fault breaks, the healing node passed, the
dead-letter email written to a file with both parts, and a store a later `kiln` reads.

`kiln demo --secure` must do the same with security on every listener (SASL_SSL with ACLs,
each service its own user, the dashboard over HTTPS behind a token), while no password or
token it drew reaches its output, its debug logs or any file it wrote outside its secrets
directory."""

from __future__ import annotations

import base64
import email
import email.policy
import http.client
import os
import re
import signal
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from kiln_testlib import clean_env, kiln, kiln_bin

# The demo's default faults (crates/kiln/src/demo_cmd.rs) and the check each one breaks.
# The check each one breaks, the node's action and its attempts (fail fast: an RMA candidate
# after one, the same fault twice after two, nothing answering after ten).
EXPECTED = {
    "host-0003": ("ecc", "gpu_ecc", "reset the GPU", 2),
    "host-0007": ("stuck-ib", "infiniband", "fix configuration", 2),
    "host-0010": ("firmware-drift", "bmc_firmware", "reflash firmware", 2),
    "host-0013": ("sel-critical", "bmc_sel", "RMA candidate", 1),
    "host-0016": ("unreachable", "bmc_health", "investigate", 10),
    "host-0018": ("row-remap", "gpu_row_remap", "RMA candidate", 1),
}


def test_demo_runs_the_whole_job(tmp_path: Path):
    work = tmp_path / "demo"
    t0 = time.monotonic()
    cp = kiln("demo", "--dir", str(work), "--dashboard", "127.0.0.1:0", timeout_s=300)
    elapsed = time.monotonic() - t0
    out = cp.stdout
    print(out)
    print(f"kiln demo reached its summary and stopped in {elapsed:.1f} s (target: under 120 s)")
    assert "PLAINTEXT" in out and "http://127.0.0.1:" in out, out
    assert_summary(out, work)


def assert_summary(out: str, work: Path) -> None:
    """The summary names every node's outcome as the injected faults call for, the email is
    written, and the store outlives the demo."""
    assert "Burn-in finished" in out, out
    assert "24 nodes, 18 passed, 6 dead-lettered" in out, out
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\s+(host-\d{4})\s.*$", out, re.M)}
    for host, (fault, check, action, attempts) in EXPECTED.items():
        row = rows.get(host)
        assert row is not None, f"{host} missing from the summary:\n{out}"
        assert fault in row and "dead_lettered" in row and check in row, row
        assert row.rstrip().endswith(action), row
        assert re.search(rf"dead_lettered\s+{attempts}\s", row), (attempts, row)
    healed = rows.get("host-0021", "")
    assert "flaky:1" in healed and "passed" in healed, healed

    # The daily report, written by the file transport: text and HTML parts, every node.
    mails = list((work / "mail").glob("*.eml"))
    assert len(mails) == 1, mails
    msg = email.message_from_bytes(mails[0].read_bytes(), policy=email.policy.default)
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    for host, (_, check, _, _) in EXPECTED.items():
        assert host in text and host in html, host
        assert check in text, (host, check)
    assert str(mails[0]) in out

    # The store outlives the demo: the CLI reads a dead-lettered node's history from it.
    db = f"sqlite://{work / 'kiln.db'}"
    shown = kiln("nodes", "show", "host-0003", "--database-url", db).stdout
    assert "dead_lettered" in shown and "gpu_ecc" in shown, shown


def wait_for_text(path: Path, needle: str, proc: subprocess.Popen, timeout_s: float) -> str:
    """The text of `path` once it holds `needle` (the process must stay up meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = path.read_text(errors="replace")
        if needle in text:
            return text
        assert proc.poll() is None, f"kiln demo exited with {proc.returncode}:\n{text[-6000:]}"
        assert time.monotonic() < deadline, f"no {needle!r} within {timeout_s} s:\n{text[-6000:]}"
        time.sleep(0.5)


def https_get(url: str, ca: Path, token: str | None = None) -> tuple[int, str]:
    """GET over HTTPS trusting only the demo's CA; with a token, as HTTP Basic's password."""
    m = re.match(r"https://([\d.]+):(\d+)(/.*)", url)
    assert m, url
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection(m.group(1), int(m.group(2)), context=ctx, timeout=10)
    headers = {}
    if token is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"demo:{token}".encode()).decode()
    try:
        conn.request("GET", m.group(3), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


@pytest.mark.timeout(420)
def test_secure_demo_runs_the_whole_job_and_no_secret_reaches_its_output(tmp_path: Path):
    """`kiln demo --secure --stay` at RUST_LOG=debug: the same summary as the plaintext demo;
    the dashboard answers only over HTTPS, only with its token, and samples burnin's lag as
    its own SCRAM user; then, stopped with Ctrl-C, no password or token appears in its output
    (every log line, debug included) or in any file under its work directory but the secrets
    themselves."""
    work = tmp_path / "demo"
    log = tmp_path / "demo.out"
    env = clean_env()
    # Every debug line, Kiln's and its libraries' (librdkafka's log, rustls, russh, sqlx,
    # openraft): about 7 MB.
    env["RUST_LOG"] = "debug"
    env.pop("KILN_LOG_LEVEL", None)
    t0 = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [kiln_bin(), "demo", "--secure", "--stay", "--dir", str(work),
             "--dashboard", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env)
    try:
        text = wait_for_text(log, "Ctrl-C to stop", proc, 360)
        elapsed = time.monotonic() - t0
        print(f"kiln demo --secure reached its summary in {elapsed:.1f} s")
        assert "SASL_SSL" in text, text[-6000:]
        # The summary lines are stdout's; the debug lines in between are stderr's.
        summary = "\n".join(l for l in text.splitlines() if not re.match(r"^\S*\d{4}-\d\d-\d\dT", l)
                            and " DEBUG " not in l and " INFO " not in l)
        assert_summary(summary, work)

        secrets_dir = work / "secrets"
        ca = secrets_dir / "ca.crt"
        token = (secrets_dir / "dashboard.token").read_text().strip()
        m = re.search(r"^Dashboard: (https://127\.0\.0\.1:\d+/)$", text, re.M)
        assert m, text[-6000:]
        url = m.group(1)
        status, _ = https_get(url, ca)
        assert status == 401, status
        status, _ = https_get(url, ca, token="kiln_" + "0" * 64)
        assert status == 401, status
        assert https_get(url + "healthz", ca)[0] == 200
        status, page = https_get(url, ca, token=token)
        assert status == 200 and "rack-" in page, (status, page[:2000])
        # The lag sampler logs in as `dashboard` with DESCRIBE on the groups and topics only.
        deadline = time.monotonic() + 30
        while True:
            status, page = https_get(url + "lag", ca, token=token)
            assert status == 200, status
            if "<td>burnin</td>" in page and "<td>deadletter</td>" in page:
                break
            assert time.monotonic() < deadline, page[-3000:]
            time.sleep(1)
        # Plain HTTP gets no page.
        host, port = url[len("https://"):-1].split(":")
        plain = http.client.HTTPConnection(host, int(port), timeout=5)
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.request("GET", "/healthz")
            plain.getresponse().read()
        plain.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    text = log.read_text(errors="replace")
    assert rc == 0, f"kiln demo --secure exited {rc}:\n{text[-6000:]}"
    assert "refused by the ACLs" not in text, "a service was refused something its role needs"

    # The secrets it drew: five passwords (admin and one per service) and the token.
    secrets = {p.name: p.read_text().strip() for p in secrets_dir.iterdir()
               if p.suffix == ".password" or p.name == "dashboard.token"}
    assert sorted(secrets) == ["admin.password", "agent.password", "dashboard.password",
                               "dashboard.token", "deadletter.password", "intake.password"], secrets
    assert all(len(v) >= 32 for v in secrets.values()), "every secret is drawn at random"
    debug_lines = sum(1 for l in text.splitlines() if " DEBUG " in l)
    print(f"output: {len(text) / 1e6:.1f} MB, {debug_lines} debug lines")
    assert debug_lines > 100, "RUST_LOG=debug was not in effect"
    for name, secret in secrets.items():
        assert secret not in text, f"{name} is in the demo's output"
    # Nor in anything it wrote: the broker's data and metadata log, the store, the email, the
    # fleet's files. The secrets directory itself holds them, and the token file their hashes.
    scanned = 0
    for root, _, files in os.walk(work):
        if Path(root) == secrets_dir:
            continue
        for fname in files:
            data = (Path(root) / fname).read_bytes()
            scanned += 1
            for name, secret in secrets.items():
                assert secret.encode() not in data, f"{name} is in {Path(root) / fname}"
    assert scanned > 10, scanned
    print(f"no secret in the output nor in {scanned} files under {work}")


def test_demo_refuses_a_used_directory(tmp_path: Path):
    (tmp_path / "old.txt").write_text("not empty")
    cp = kiln("demo", "--dir", str(tmp_path), check=False, timeout_s=60)
    assert cp.returncode != 0
    assert "not empty" in cp.stderr, cp.stderr
    assert (tmp_path / "old.txt").read_text() == "not empty"
