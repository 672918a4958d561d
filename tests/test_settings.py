"""`kiln intake serve` and `kiln dashboard` take their settings as the other services do
(kiln-settings): built-in defaults, then `--config FILE`, then `KILN_INTAKE__<SECTION>__<KEY>`
/ `KILN_DASHBOARD__<SECTION>__<KEY>` variables, then flags. The real binary, real HTTPS
clients (Python's http.client and ssl), certificates from `kiln certs`, tokens from
`kiln tokens`.

- intake from a settings file (store, broker, topic, listen address) with its HTTPS
  certificate, key and token file from the environment; a variable beats the file's listen
  address; a manifest POST needs the write token and is queued.
- the dashboard from the environment alone (HTTPS, tokens, store, no lag), then from a file.
- a misspelt variable, a misspelt file key, a missing file, and the variables these commands
  read before (`KILN_HTTPS_CERT`, `KILN_SASL_PASSWORD`, ...) are refused, each named (the
  earlier ones with the variable to set instead), and no secret shows in the errors.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from kiln_testlib import clean_env, free_port, kiln, kiln_bin

MANIFEST = (
    "hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,"
    "firmware_gpu_vbios,firmware_nic\n"
    "gpu-s-01,rack-set,10.41.0.11,H100-SXM,8,1.10,2.3.1,96.00,28.39\n"
    "gpu-s-02,rack-set,10.41.0.12,H100-SXM,8,1.10,2.3.1,96.00,28.39\n"
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("settings-pki")
    ca = str(root / "ca")
    kiln("certs", "ca", "--dir", ca)
    kiln("certs", "server", "--ca-dir", ca, "--name", "web", "--host", "127.0.0.1",
         "--out", str(root / "certs"))
    return root


def tokens(path: Path) -> dict[str, str]:
    return {scope: kiln("tokens", "create", f"{scope}-token", "--scope", scope,
                        "--file", str(path)).stdout.strip()
            for scope in ("write", "read")}


def env_with(extra: dict[str, str]) -> dict:
    env = clean_env()
    # Nothing of the caller's own settings may leak in: only what the test sets.
    for k in list(env):
        if k.startswith(("KILN_INTAKE", "KILN_DASHBOARD", "KILN_HTTPS", "KILN_TOKENS",
                         "KILN_DATABASE", "KILN_TLS", "KILN_SASL")):
            del env[k]
    return {**env, **extra}


def request(port: int, ctx: ssl.SSLContext, method: str, path: str, body: bytes = b"",
            headers: dict | None = None) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(120)
def test_intake_serve_from_a_file_with_https_and_tokens_from_the_environment(broker, pki,
                                                                            tmp_path):
    kiln("topics", "create", "kiln.nodes", "--partitions", "2", "--bootstrap", broker.addr)
    tokens_file = tmp_path / "tokens"
    tok = tokens(tokens_file)
    file_port, env_port = free_port(), free_port()
    config = tmp_path / "intake.toml"
    config.write_text(f'listen = "127.0.0.1:{file_port}"\n'
                      f'bootstrap = "{broker.addr}"\n'
                      f'database_url = "sqlite://{tmp_path / "kiln.db"}"\n'
                      'topic = "kiln.nodes"\n')
    env = env_with({
        "KILN_INTAKE_CONFIG": str(config),
        "KILN_INTAKE__LISTEN": f"127.0.0.1:{env_port}",
        "KILN_INTAKE__HTTPS__CERT_FILE": str(pki / "certs" / "web.crt"),
        "KILN_INTAKE__HTTPS__KEY_FILE": str(pki / "certs" / "web.key"),
        "KILN_INTAKE__TOKENS_FILE": str(tokens_file),
    })
    log = tmp_path / "intake.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([kiln_bin(), "intake", "serve"], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, env=env)
    ctx = ssl.create_default_context(cafile=str(pki / "ca" / "ca.crt"))
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"exited {proc.returncode}\n{log.read_text()[-3000:]}"
            try:
                if request(env_port, ctx, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        print(f"intake serving HTTPS from file + environment after "
              f"{time.monotonic() - started:.2f} s")
        path, body = "/v1/racks/rack-set/manifest", MANIFEST.encode()
        csv = {"Content-Type": "text/csv"}
        assert request(env_port, ctx, "POST", path, body, csv)[0] == 401
        status, text = request(env_port, ctx, "POST", path, body,
                               {**csv, "Authorization": f"Bearer {tok['read']}"})
        assert status == 403, text
        status, text = request(env_port, ctx, "POST", path, body,
                               {**csv, "Authorization": f"Bearer {tok['write']}"})
        assert status == 200, text
        assert len(json.loads(text)["queued"]) == 2, text
        with pytest.raises(OSError):
            request(file_port, ctx, "GET", "/healthz")  # the variable beat the file
    finally:
        stop(proc)
    text = log.read_text()
    assert f"intake listening on https://127.0.0.1:{env_port}" in text, text[-3000:]
    assert all(t not in text for t in tok.values())


def start_dashboard(tmp_path: Path, name: str, args: list[str], extra_env: dict[str, str]
                    ) -> tuple[subprocess.Popen, int, Path]:
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([kiln_bin(), "dashboard", *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, env=env_with(extra_env))
    line = proc.stdout.readline().decode()
    m = re.search(r"https://127\.0\.0\.1:(\d+)/", line)
    if not m:
        stop(proc)
        pytest.fail(f"no HTTPS listening line: {line!r}\n{log.read_text()[-3000:]}")
    return proc, int(m.group(1)), log


def check_pages_need_the_read_token(port: int, pki: Path, tok: dict[str, str]) -> None:
    ctx = ssl.create_default_context(cafile=str(pki / "ca" / "ca.crt"))
    assert request(port, ctx, "GET", "/healthz")[0] == 200
    assert request(port, ctx, "GET", "/")[0] == 401
    basic = base64.b64encode(f"ops:{tok['read']}".encode()).decode()
    status, page = request(port, ctx, "GET", "/", headers={"Authorization": f"Basic {basic}"})
    assert status == 200 and "<html" in page.lower(), page[:300]


@pytest.mark.timeout(120)
def test_dashboard_from_the_environment_alone_then_from_a_file(pki, tmp_path):
    tokens_file = tmp_path / "tokens"
    tok = tokens(tokens_file)
    db_url = f"sqlite://{tmp_path / 'kiln.db'}"
    cert, key = str(pki / "certs" / "web.crt"), str(pki / "certs" / "web.key")
    proc, port, log = start_dashboard(tmp_path, "dashboard-env", [], {
        "KILN_DASHBOARD__LISTEN": "127.0.0.1:0",
        "KILN_DASHBOARD__DATABASE_URL": db_url,
        "KILN_DASHBOARD__LAG": "false",
        "KILN_DASHBOARD__HTTPS__CERT_FILE": cert,
        "KILN_DASHBOARD__HTTPS__KEY_FILE": key,
        "KILN_DASHBOARD__TOKENS_FILE": str(tokens_file),
    })
    try:
        check_pages_need_the_read_token(port, pki, tok)
    finally:
        stop(proc)

    config = tmp_path / "dashboard.toml"
    config.write_text(f'listen = "127.0.0.1:0"\ndatabase_url = "{db_url}"\nlag = false\n'
                      f'tokens_file = "{tokens_file}"\n'
                      f'[https]\ncert_file = "{cert}"\nkey_file = "{key}"\n')
    proc, port, log = start_dashboard(tmp_path, "dashboard-file", ["--config", str(config)], {})
    try:
        check_pages_need_the_read_token(port, pki, tok)
    finally:
        stop(proc)
    assert "lag from nowhere" in log.read_text(), log.read_text()[-2000:]


def refused(args: list[str], extra_env: dict[str, str]) -> str:
    cp = subprocess.run([kiln_bin(), *args], capture_output=True, text=True, timeout=30,
                        stdin=subprocess.DEVNULL, env=env_with(extra_env))
    assert cp.returncode != 0, f"kiln {' '.join(args)} started with {extra_env}: {cp.stdout}"
    return cp.stderr


@pytest.mark.timeout(60)
def test_misspelt_unknown_and_earlier_settings_are_refused_by_name(tmp_path):
    secret = "settings-secret-5be1d0"
    intake, dashboard = ["intake", "serve"], ["dashboard", "--no-lag"]
    # A misspelt variable: named in full, its value never shown.
    err = refused(intake, {"KILN_INTAKE__HTTPS__CERT": "/etc/kiln/web.crt"})
    assert "KILN_INTAKE__HTTPS__CERT" in err and "cert_file" in err, err
    err = refused(dashboard, {"KILN_DASHBOARD__BROKER__SASL_PASWORD": secret})
    assert "KILN_DASHBOARD__BROKER__SASL_PASWORD" in err and secret not in err, err
    # A bad value: the variable named.
    err = refused(dashboard, {"KILN_DASHBOARD__REFRESH_S": "soon"})
    assert "KILN_DASHBOARD__REFRESH_S" in err, err
    # A misspelt key in the file, with the file; a missing file.
    config = tmp_path / "intake.toml"
    config.write_text('[https]\ncert_fle = "/etc/kiln/web.crt"\n')
    err = refused([*intake, "--config", str(config)], {})
    assert "cert_fle" in err and str(config) in err, err
    err = refused(dashboard, {"KILN_DASHBOARD_CONFIG": str(tmp_path / "missing.toml")})
    assert "missing.toml does not exist" in err, err
    # The variables these commands took their flags from before: refused, with the new name.
    for args, old, new in [
        (intake, "KILN_HTTPS_CERT", "KILN_INTAKE__HTTPS__CERT_FILE"),
        (intake, "KILN_DATABASE_URL", "KILN_INTAKE__DATABASE_URL"),
        (dashboard, "KILN_TOKENS_FILE", "KILN_DASHBOARD__TOKENS_FILE"),
        (dashboard, "KILN_SASL_PASSWORD", "KILN_DASHBOARD__BROKER__SASL_PASSWORD"),
    ]:
        err = refused(args, {old: secret})
        assert old in err and new in err and secret not in err, err
        print(f"{old}: {err.strip().splitlines()[-1]}")
    # The tools keep them: `kiln intake register` still reads KILN_DATABASE_URL.
    help_text = kiln("intake", "register", "--help").stdout
    assert "[env: KILN_DATABASE_URL]" in help_text, help_text
