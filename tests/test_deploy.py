"""Deployment files under deploy/: the Prometheus alert rules and scrape config (promtool:
syntax, and unit tests of the alerts firing), every metric an expression uses is one the code
exports, and the systemd units (systemd-analyze verify, plus the options operations rely on)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kiln_testlib import kiln, kiln_bin

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "kiln-alerts.yml"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
EXPORTERS = [ROOT / "crates" / "kiln-broker" / "src", ROOT / "crates" / "kiln-agent" / "src"]
# Metrics Prometheus records itself for every target.
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                "group_right", "bool", "offset", "inf", "nan"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: scripts/install-test-deps installs Debian's prometheus package")
    return path


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60)


def exported_metric_names() -> set[str]:
    """Every `kiln_...` string literal in the broker's and the agent's sources."""
    names = set()
    for d in EXPORTERS:
        for f in d.rglob("*.rs"):
            names.update(re.findall(r'"(kiln_[a-z0-9_]+)"', f.read_text()))
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (labels, strings, ranges and functions removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    out = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in PROMQL_WORDS:
            continue  # a function call or an operator keyword
        out.add(m.group(0))
    return out


def test_promtool_checks_rules_config_and_alert_unit_tests():
    tool = promtool()
    for args in (["check", "rules", str(RULES)],
                 ["check", "config", str(DEPLOY / "prometheus" / "prometheus.example.yml")],
                 ["test", "rules", str(DEPLOY / "prometheus" / "kiln-alerts.test.yml")]):
        r = run(tool, *args)
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    assert "SUCCESS" in r.stdout


def test_every_alert_uses_exported_metrics_and_is_annotated():
    exported = exported_metric_names()
    # Sanity: the scan finds what the broker and agent are known to export.
    assert {"kiln_group_retention_fraction", "kiln_log_fsync_duration_seconds",
            "kiln_agent_node_outcomes_total"} <= exported
    doc = yaml.safe_load(RULES.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"]]
    assert {a["alert"] for a in alerts} >= {
        "KilnConsumerLagNearRetention", "KilnUnderReplicatedPartitions", "KilnDeadLetterGrowth",
        "KilnAgentDown", "KilnFsyncLatencyHigh"}
    for a in alerts:
        names = metric_names(a["expr"])
        assert names, f"{a['alert']}: no metric found in {a['expr']!r}"
        for n in names:
            if n in PROMETHEUS_OWN:
                continue
            base = re.sub(r"_(bucket|sum|count)$", "", n)
            assert n in exported or base in exported, \
                f"{a['alert']} uses {n}, which neither the broker nor the agent exports"
        assert a["labels"]["severity"] in ("warning", "critical"), a["alert"]
        assert a["annotations"]["summary"], a["alert"]


def test_metric_name_extraction():
    assert metric_names('histogram_quantile(0.99, sum by (instance, le) '
                        '(rate(kiln_log_fsync_duration_seconds_bucket{a="b"}[5m]))) > 0.05') == \
        {"kiln_log_fsync_duration_seconds_bucket"}
    assert metric_names('(sum(x{group="burnin"}) or vector(0)) == 0 and sum(y) > 0') == {"x", "y"}


def unit_options(path: Path) -> dict[str, list[str]]:
    opts: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, val = line.partition("=")
        opts.setdefault(key.strip(), []).append(val.strip())
    return opts


def test_systemd_units_have_the_options_operations_rely_on():
    names = {u.name for u in UNITS}
    assert names == {"kiln-broker.service", "kiln-agent.service", "kiln-intake.service",
                     "kiln-deadletter.service", "kiln-dashboard.service"}
    for unit in UNITS:
        o = unit_options(unit)
        for key, want in {"User": "kiln", "Group": "kiln", "Restart": "on-failure",
                          "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                          "ProtectHome": "yes", "PrivateTmp": "yes", "StateDirectory": "kiln",
                          "ConfigurationDirectory": "kiln", "CapabilityBoundingSet": "",
                          "WantedBy": "multi-user.target"}.items():
            assert o.get(key) == [want], f"{unit.name}: {key}={o.get(key)}"
        assert int(o["LimitNOFILE"][0]) >= 65536, unit.name
        (exec_start,) = o["ExecStart"]
        argv = exec_start.split()
        assert argv[0] == "/usr/local/bin/kiln", unit.name
        config = [a for a in argv if a.startswith("/etc/")] + o.get("EnvironmentFile", [])
        assert config and all(c.startswith("/etc/kiln/") for c in config), unit.name


def test_systemd_units_name_real_subcommands():
    """Each unit's ExecStart, with the real binary, is accepted by its subcommand's parser."""
    for unit in UNITS:
        (exec_start,) = unit_options(unit)["ExecStart"]
        argv = exec_start.split()[1:]
        sub = argv[:2] if argv[0] == "intake" else argv[:1]
        r = kiln(*sub, "--help", check=False)
        assert r.returncode == 0, f"{unit.name}: kiln {' '.join(sub)} --help: {r.stderr}"
        for flag in (a for a in argv if a.startswith("--")):
            assert flag in r.stdout, f"{unit.name}: kiln {' '.join(sub)} has no {flag}"


def test_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed; the structural checks above still ran")
    # verify checks that ExecStart's binary exists: point it at the one under test.
    for unit in UNITS:
        text = unit.read_text().replace("/usr/local/bin/kiln", kiln_bin())
        (tmp_path / unit.name).write_text(text)
    r = run(analyze, "verify", "--man=no", *[f"./{u.name}" for u in UNITS], cwd=tmp_path)
    # verify reports unknown keys and bad values on stderr but may still exit 0.
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", \
        f"systemd-analyze verify:\n{r.stdout}\n{r.stderr}"
