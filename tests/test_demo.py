"""`kiln demo`: the whole job in one process. It must reach its summary with every injected
permanent fault dead-lettered on the check that fault breaks, the healing node passed, the
dead-letter email written to a file with both parts, and a store a later `kiln` reads."""

from __future__ import annotations

import email
import email.policy
import re
import time
from pathlib import Path

from kiln_testlib import kiln

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


def test_demo_refuses_a_used_directory(tmp_path: Path):
    (tmp_path / "old.txt").write_text("not empty")
    cp = kiln("demo", "--dir", str(tmp_path), check=False, timeout_s=60)
    assert cp.returncode != 0
    assert "not empty" in cp.stderr, cp.stderr
    assert (tmp_path / "old.txt").read_text() == "not empty"
