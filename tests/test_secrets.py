"""Passwords and tokens never show (docs/security.md, "Secrets"): not in `--help` of any
subcommand, even with every secret-bearing environment variable set, and not in the errors
of commands given a secret and something wrong next to it.

The logs of a whole secure run are grepped by test_demo.py
(`test_secure_demo_runs_the_whole_job_and_no_secret_reaches_its_output`) and, for the broker,
intake, the agent and the dashboard as separate processes, by test_acls.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from kiln_testlib import clean_env, free_port, kiln_bin

# Every variable a Kiln command or settings file reads a secret from, with a value to look for.
DB_PASSWORD = "help-db-pw-9b03f2"
SECRET_ENV = {
    "KILN_SASL_PASSWORD": "help-sasl-pw-7c1e90",
    "KILN_NEW_USER_PASSWORD": "help-new-user-pw-22ad41",
    "KILN_DATABASE_URL": f"postgres://kiln:{DB_PASSWORD}@db.example:5432/kiln",
    "KILN_DEADLETTER__SMTP__PASSWORD": "help-smtp-pw-4e7a18",
    "KILN_AGENT__REDFISH__PASSWORD": "help-bmc-pw-61d0c3",
    "KILN_INTAKE__KAFKA_PASSWORD": "help-intake-kafka-pw-3d81b2",
    "KILN_DASHBOARD__BROKER__SASL_PASSWORD": "help-dashboard-sasl-pw-c47e05",
}
FILE_SECRET = "help-file-pw-0a5d77"
SECRETS = [v for k, v in SECRET_ENV.items() if k != "KILN_DATABASE_URL"] + [DB_PASSWORD,
                                                                            FILE_SECRET]
# Subcommands that take a secret (a password, a token file, a database URL, a config file with
# passwords); the walk must reach every one.
TAKE_SECRETS = {"demo", "broker", "topics", "groups", "users", "users create", "acls",
                "acls create", "intake", "intake register", "intake serve", "agent",
                "deadletter", "dashboard", "status", "nodes", "dlq", "tokens", "tokens create",
                "playbook run"}
COMMAND_RE = re.compile(r"^  ([a-z][a-z0-9-]*)(?:\s|$)")


def run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([kiln_bin(), *args], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env=env)


def subcommands(help_text: str) -> list[str]:
    """The names under `Commands:` in a clap help text, `help` left out."""
    names, inside = [], False
    for line in help_text.splitlines():
        if line.startswith("Commands:"):
            inside = True
            continue
        if inside:
            if not line.strip() or not line.startswith(" "):
                break
            m = COMMAND_RE.match(line)
            if m and m.group(1) != "help":
                names.append(m.group(1))
    return names


def test_no_help_text_shows_a_secret(tmp_path: Path):
    secret_file = tmp_path / "pw"
    secret_file.write_text(FILE_SECRET + "\n")
    env = {**clean_env(), **SECRET_ENV, "KILN_SASL_PASSWORD_FILE": str(secret_file),
           "KILN_TOKENS_FILE": str(secret_file)}
    seen: dict[str, str] = {}
    queue: list[list[str]] = [[]]
    while queue:
        path = queue.pop(0)
        assert len(seen) < 200, "more subcommands than any kiln has: the walk is looping"
        texts = []
        for flag in ("--help", "-h"):
            cp = run([*path, flag], env)
            assert cp.returncode == 0, (path, flag, cp.stderr)
            texts.append(cp.stdout + cp.stderr)
        name = " ".join(path) or "kiln"
        seen[name] = texts[0]
        for text in texts:
            for secret in SECRETS:
                assert secret not in text, f"`kiln {name} --help` shows a secret:\n{text}"
        queue.extend([*path, sub] for sub in subcommands(texts[0]))
    missing = TAKE_SECRETS - set(seen)
    assert not missing, f"the walk never reached {sorted(missing)}; it saw {sorted(seen)}"
    # The database URL's variable is named, its value (which may hold a password) is not.
    assert "[env: KILN_DATABASE_URL]" in seen["intake register"], seen["intake register"]
    print(f"{len(seen)} help texts (each with --help and -h), no secret in any")


def test_errors_next_to_a_secret_do_not_show_it(tmp_path: Path):
    secret = "err-secret-3f9c2a"
    env = clean_env()
    for k in SECRET_ENV:
        env.pop(k, None)
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    manifest = tmp_path / "rack.csv"
    manifest.write_text("hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,"
                        "firmware_bios,firmware_gpu_vbios,firmware_nic\n"
                        "gpu-e-01,rack-e,10.40.0.11,H100-SXM,8,1.10,2.3.1,96.00,28.39\n")
    pw_file = tmp_path / "pw"
    pw_file.write_text(secret + "\n")
    agent_cfg = tmp_path / "agent.toml"
    agent_cfg.write_text(f'playbook = "{tmp_path / "p.yaml"}"\n'
                         f'kafka_password_file = "{pw_file}"\n'
                         f'[kafka]\n"sasl.password" = "{secret}"\n')
    triage_cfg = tmp_path / "deadletter.toml"
    triage_cfg.write_text(f'[report]\ntime = "25:61"\n[smtp]\nusername = "kiln"\n'
                          f'password = "{secret}"\n')
    cases = {
        # A mistyped KEY=VALUE that would be a password.
        "intake --kafka-config": (["intake", "register", str(manifest), "--bootstrap", dead,
                                   "--database-url", f"sqlite://{tmp_path / 'k.db'}",
                                   "--kafka-config", f"sasl.password:{secret}"], {}),
        # A password as a flag, which `ps` and shell history would keep.
        "intake --kafka-config sasl.password": (
            ["intake", "register", str(manifest), "--bootstrap", dead,
             "--database-url", f"sqlite://{tmp_path / 'k.db'}",
             "--kafka-config", f"sasl.password={secret}"], {}),
        # A login to a broker that is not there, password from the environment.
        "users list": (["users", "list", "--bootstrap", dead, "--timeout-s", "2",
                        "--sasl-user", "admin"], {"KILN_SASL_PASSWORD": secret}),
        # A login to a broker that is not there, password from a file.
        "topics list": (["topics", "list", "--bootstrap", dead, "--timeout-s", "2",
                         "--sasl-user", "admin", "--sasl-password-file", str(pw_file)], {}),
        # A PostgreSQL URL with a password, the server not there.
        "nodes show": (["nodes", "show", "host-1", "--database-url",
                        f"postgres://kiln:{secret}@{dead}/kiln"], {}),
        # A password twice in the agent's settings.
        "agent": (["agent", "--config", str(agent_cfg)], {}),
        # A bad report time beside the SMTP password.
        "deadletter": (["deadletter", "--config", str(triage_cfg), "report", "--dry-run"], {}),
        # A bad lag interval beside the lag sampler's password from the environment.
        "dashboard": (["dashboard", "--lag-interval-s", "0"],
                      {"KILN_DASHBOARD__BROKER__SASL_PASSWORD": secret}),
        # A password given twice to intake: in the environment and as a file.
        "intake serve": (["intake", "serve"], {"KILN_INTAKE__KAFKA_PASSWORD": secret,
                                               "KILN_INTAKE__KAFKA_PASSWORD_FILE": str(pw_file)}),
    }
    # What each error must say: that it is about the thing next to the secret.
    expected = {"intake --kafka-config": "expected KEY=VALUE",
                "intake --kafka-config sasl.password": "not taken from the command line",
                "users list": "connect",
                "topics list": "connect", "nodes show": "postgres://kiln:***@",
                "agent": "not both", "deadletter": "25:61", "dashboard": "out of range",
                "intake serve": "not both"}
    for name, (args, extra_env) in cases.items():
        cp = run(args, {**env, **extra_env})
        text = cp.stdout + cp.stderr
        assert cp.returncode != 0, f"{name} succeeded: {text}"
        assert "error" in text.lower() and expected[name] in text, f"{name}: {text}"
        assert secret not in text, f"{name} shows the secret:\n{text}"
        print(f"{name}: {text.strip().splitlines()[-1][:160]}")
