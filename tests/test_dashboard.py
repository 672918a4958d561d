"""`kiln dashboard` in a real browser, on a store filled through the real paths.

A broker (fixture), `kiln topics create`, `kiln intake register` of a JSON manifest with
hostile strings in its text fields, and one `kiln agent` running a scripted playbook (one node
always fails with a hostile message and is dead-lettered after 10 attempts; the others pass).
`kiln status --plain` tells when the burn-in is over. Then `kiln dashboard` serves the store
and samples lag from the broker, and headless Chromium loads the overview, a rack, a node and
the dead-letter list (`--dump-dom`, so the DOM is what the browser built, inline script run),
and takes a screenshot of the overview (its path is printed).

Chromium is required: without it the test fails, unless KILN_ALLOW_NO_CHROMIUM=1 says that
skipping is intended. `scripts/install-test-deps` installs Debian's chromium.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from kiln_testlib import clean_env, kiln, kiln_bin

RACKS = ["rack-east", "rack-west"]
BAD = "gpu-east-02"
HOSTILE_FW = "<script>alert('fw')</script>"
HOSTILE_LABEL = "\"><img src=x onerror=alert(2)>"
HOSTILE_MSG = "<img src=y onerror=alert(3)> GPU 3 missing"


def chromium_bin() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("KILN_ALLOW_NO_CHROMIUM") == "1":
        pytest.skip("no chromium on PATH (KILN_ALLOW_NO_CHROMIUM=1)")
    pytest.fail("no chromium on PATH: run scripts/install-test-deps (Debian package chromium), "
                "or set KILN_ALLOW_NO_CHROMIUM=1 to skip this test on purpose", pytrace=False)
    return None


def chromium(browser: str, profile: Path, *args: str) -> str:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, f"{' '.join(cmd)} exited {cp.returncode}\n{cp.stderr[-3000:]}"
    return cp.stdout


def nodes() -> list[dict]:
    out = []
    for rack in RACKS:
        side = rack.split("-")[1]
        for i in range(3):
            out.append({
                "hostname": f"gpu-{side}-{i:02d}", "rack": rack, "bmc_address": "10.0.0.1",
                "gpu_model": "H100-SXM", "gpu_count": 8, "firmware_bmc": HOSTILE_FW,
                "firmware_bios": "2.3.1", "firmware_gpu_vbios": "96.00", "firmware_nic": "28.39",
                "labels": {"row": HOSTILE_LABEL},
            })
    return out


def status_rows(db_url: str) -> dict[str, list[str]]:
    out = kiln("status", "--plain", "--database-url", db_url).stdout
    lines = out.strip().splitlines()
    assert lines[0].split() == ["RACK", "TOTAL", "PASSED", "DEAD_LETTERED", "RUNNING",
                                "RETRYING", "QUEUED", "FINISHED%"], out
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def wait_lag(base: str, log: Path, done, timeout_s: float = 60) -> list[tuple[str, ...]]:
    """Polls /lag until the burnin rows (partition, committed, log end, lag) satisfy `done`."""
    deadline = time.monotonic() + timeout_s
    while True:
        page = http_get(f"{base}/lag")
        rows = re.findall(r"<tr><td><i [^>]*></i></td><td>burnin</td><td>kiln\.nodes</td>"
                          r"<td class=\"num\">(\d)</td><td class=\"num\">([^<]+)</td>"
                          r"<td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td>", page)
        if len(rows) == 3 and "The last sample" not in page and done(rows):
            return rows
        assert time.monotonic() < deadline, f"burnin lag not as expected: {rows}\n" \
                                            f"{page[-2000:]}\n{log.read_text()[-3000:]}"
        time.sleep(0.3)


@pytest.mark.timeout(240)
def test_dashboard_in_chromium(broker, tmp_path):
    browser = chromium_bin()
    b = ["--bootstrap", broker.addr]
    kiln("topics", "create", "kiln.nodes", "--partitions", "3", *b)
    kiln("topics", "create", "kiln.nodes.dlq", "--partitions", "1", *b)
    db_url = f"sqlite://{tmp_path / 'kiln.db'}"
    manifest = tmp_path / "fleet.json"
    manifest.write_text(json.dumps({"nodes": nodes()}))
    kiln("intake", "register", str(manifest), "--database-url", db_url, *b)

    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(
        "playbook: dashboard-e2e\ntimeout_s: 30\nchecks:\n"
        "- check: scripted\n  name: warmup\n  outcome: pass\n"
        f"- check: scripted\n  name: gpu_count\n  outcome: fail\n  hosts: [{BAD}]\n"
        f"  message: {json.dumps(HOSTILE_MSG)}\n")
    agent_cfg = tmp_path / "agent.toml"
    agent_cfg.write_text(
        f'bootstrap = "{broker.addr}"\ndatabase_url = "{db_url}"\nagent_id = "agent-dash"\n'
        f'playbook = "{playbook}"\nretry_backoff_ms = 20\nretry_backoff_max_ms = 50\n'
        'session_timeout_ms = 6000\nmetrics_listen = "off"\n')
    procs: list[subprocess.Popen] = []
    agent_log = tmp_path / "agent.log"
    dash_log = tmp_path / "dashboard.log"
    try:
        # The dashboard starts before the agent, so its lag history sees the backlog drain.
        with open(dash_log, "wb") as log:
            dash = subprocess.Popen(
                [kiln_bin(), "dashboard", "--listen", "127.0.0.1:0", "--database-url", db_url,
                 "--lag-interval-s", "0.5", *b],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=clean_env())
        procs.append(dash)
        line = dash.stdout.readline().decode()
        m = re.search(r"http://(127\.0\.0\.1:\d+)/", line)
        assert m, f"no listening line: {line!r}\n{dash_log.read_text()}"
        base = f"http://{m.group(1)}"
        # Before any agent: the 6 registered nodes are burnin's lag, counted from the log start.
        rows = wait_lag(base, dash_log, lambda rows: sum(int(r[3]) for r in rows) == 6)
        assert all(r[1].startswith("none") for r in rows), rows

        with open(agent_log, "wb") as log:
            agent = subprocess.Popen([kiln_bin(), "agent", "--config", str(agent_cfg)],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     env=clean_env())
        procs.append(agent)
        deadline = time.monotonic() + 120
        while True:
            rows = status_rows(db_url)
            if rows.get("TOTAL", [None])[-1] == "100.0":
                break
            assert agent.poll() is None, f"agent exited\n{agent_log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"burn-in not finished: {rows}\n" \
                                                f"{agent_log.read_text()[-4000:]}"
            time.sleep(0.5)
        # TOTAL passed dead running retrying queued finished%
        assert rows["TOTAL"] == ["6", "5", "1", "0", "0", "0", "100.0"], rows
        assert rows["rack-east"] == ["3", "2", "1", "0", "0", "0", "100.0"], rows

        # The agent commits everything it consumed: the lag drains to 0 on every partition
        # (one that no rack hashes to has no records and no commit).
        rows = wait_lag(base, dash_log, lambda rows: all(r[3] == "0" for r in rows)
                        and sum(int(r[2]) for r in rows) >= 6 + 9)  # 6 nodes + 9 retries
        assert all(r[1] == r[2] or (r[1].startswith("none") and r[2] == "0") for r in rows), rows

        profile = tmp_path / "chromium-profile"
        overview = chromium(browser, profile, "--dump-dom", f"{base}/")
        for rack in RACKS:
            assert f'data-rack="{rack}"' in overview, overview[:3000]
        assert re.search(r"<strong>6</strong> nodes in <strong>2</strong> racks", overview)
        assert 'id="total-passed">5<' in overview and 'id="total-dead_lettered">1<' in overview
        assert '<svg id="lag-chart"' in overview and "<polyline" in overview, overview[-4000:]
        assert "burnin kiln.nodes/0" in overview
        # The chart shows the backlog and its drain: some point above the baseline, and every
        # line ends on it (lag 0 now). The baseline is the lowest y drawn.
        lines = [[tuple(map(float, p.split(","))) for p in pts.split()]
                 for pts in re.findall(r'<polyline [^>]*points="([^"]+)"', overview)]
        assert len(lines) == 3, lines
        baseline = max(y for line in lines for _, y in line)
        assert any(y < baseline for line in lines for _, y in line), lines
        assert all(line[-1][1] == baseline for line in lines), lines

        rack = chromium(browser, profile, "--dump-dom", f"{base}/racks/rack-east")
        for i in range(3):
            assert f'href="/nodes/gpu-east-{i:02d}"' in rack
        assert "dead_lettered" in rack and "3 nodes, 100.0% finished" in rack

        node = chromium(browser, profile, "--dump-dom", f"{base}/nodes/{BAD}")
        assert "Runs (10)" in node, node[:4000]
        assert "Cycle 1 attempt 10:" in node
        assert "gpu_count" in node and '"scripted": "Fail"' in node.replace("&quot;", '"')
        assert "&lt;img src=y onerror=alert(3)&gt; GPU 3 missing" in node
        assert "&lt;script&gt;alert('fw')&lt;/script&gt;" in node
        assert "row=\"&gt;&lt;img src=x onerror=alert(2)&gt;" in node
        # Scripted checks carry no raw output: the evidence cell says so.
        assert 'class="muted">none<' in node
        for page in (overview, rack, node):
            assert "<img" not in page and "alert('fw')</script>" not in page

        dlq = chromium(browser, profile, "--dump-dom", f"{base}/dead-letters")
        assert "1 node(s) dead-lettered" in dlq and f'href="/nodes/{BAD}"' in dlq
        assert "&lt;img src=y onerror=alert(3)&gt; GPU 3 missing" in dlq and "<img" not in dlq

        shot = tmp_path / "dashboard.png"
        chromium(browser, profile, f"--screenshot={shot}", "--window-size=1280,900",
                 "--hide-scrollbars", f"{base}/")
        assert shot.stat().st_size > 10_000, shot.stat().st_size
        print(f"dashboard screenshot: {shot}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
