"""HTTPS and authentication on intake and the dashboard (kiln-web), with real clients:
Python's http.client and ssl, and curl.

Certificates come from `kiln certs` (a server certificate for 127.0.0.1, client certificates
valid and expired), tokens from `kiln tokens` (one with write scope, one with read).

- `kiln intake serve` over HTTPS with a token file: /healthz is open; a manifest POST
  without a token is 401 with a Bearer challenge, with the read token 403, from a browser
  (Origin, a form's content type) 403 even with the write token, with the write token 200
  and queued (also from curl); a plaintext client gets no answer; a revoked token is refused
  within seconds with no restart; the log names the token, never shows it.
- `kiln intake serve` and `kiln dashboard` refuse to start open on a non-loopback address.
- `kiln dashboard` over HTTPS with a token file: a Basic challenge (a browser prompts), the
  read token as the Basic password or as Bearer works, the write token alone is 403; SIGHUP
  reloads the certificate and the dashboard keeps serving.
- `kiln dashboard` with client certificates required: no certificate and an expired one are
  refused in the handshake; a certified client reads the pages.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import signal
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from kiln_testlib import clean_env, free_port, kiln, kiln_bin

MANIFEST = (
    "hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,"
    "firmware_gpu_vbios,firmware_nic\n"
    "gpu-w-01,{rack},10.40.0.11,H100-SXM,8,1.10,2.3.1,96.00,28.39\n"
    "gpu-w-02,{rack},10.40.0.12,H100-SXM,8,1.10,2.3.1,96.00,28.39\n"
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("web-pki")
    ca = str(root / "ca")
    kiln("certs", "ca", "--dir", ca)
    kiln("certs", "server", "--ca-dir", ca, "--name", "web", "--host", "127.0.0.1",
         "--host", "localhost", "--out", str(root / "certs"))
    kiln("certs", "client", "--ca-dir", ca, "--name", "ops", "--out", str(root / "certs"))
    kiln("certs", "client", "--ca-dir", ca, "--name", "old", "--expired",
         "--out", str(root / "certs"))
    return root


def https_flags(pki: Path) -> list[str]:
    return ["--https-cert", str(pki / "certs" / "web.crt"),
            "--https-key", str(pki / "certs" / "web.key")]


def tls_context(pki: Path, client: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca" / "ca.crt"))
    if client:
        ctx.load_cert_chain(str(pki / "certs" / f"{client}.crt"),
                            str(pki / "certs" / f"{client}.key"))
    return ctx


def request(port: int, ctx: ssl.SSLContext, method: str, path: str, body: bytes = b"",
            headers: dict | None = None) -> tuple[int, dict, str]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def make_tokens(path: Path) -> dict[str, str]:
    out = {}
    for name, scope in (("ci", "write"), ("viewer", "read")):
        cp = kiln("tokens", "create", name, "--scope", scope, "--file", str(path))
        out[name] = cp.stdout.strip()
        assert re.fullmatch(r"kiln_[0-9a-f]{64}", out[name]), cp.stdout
    listed = kiln("tokens", "list", "--file", str(path)).stdout
    assert re.search(r"^ci\s+write$", listed, re.M) and re.search(r"^viewer\s+read$", listed, re.M)
    text = path.read_text()
    assert all(t[5:] not in text for t in out.values()), "the file holds hashes only"
    return out


def wait_https(port: int, ctx: ssl.SSLContext, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, f"exited {proc.returncode}\n{log.read_text()[-4000:]}"
        try:
            if request(port, ctx, "GET", "/healthz")[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(180)
def test_intake_over_https_takes_manifests_only_with_a_write_token(broker, pki, tmp_path):
    b = ["--bootstrap", broker.addr]
    kiln("topics", "create", "kiln.nodes", "--partitions", "3", *b)
    tokens_file = tmp_path / "tokens"
    tokens = make_tokens(tokens_file)
    db_url = f"sqlite://{tmp_path / 'kiln.db'}"
    port = free_port()
    log = tmp_path / "intake.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [kiln_bin(), "intake", "serve", "--listen", f"127.0.0.1:{port}",
             "--database-url", db_url, "--tokens-file", str(tokens_file), *https_flags(pki), *b],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=clean_env())
    ctx = tls_context(pki)
    try:
        wait_https(port, ctx, proc, log)
        path = "/v1/racks/rack-web/manifest"
        body = MANIFEST.format(rack="rack-web").encode()
        csv = {"Content-Type": "text/csv"}

        status, headers, text = request(port, ctx, "POST", path, body, csv)
        assert status == 401, text
        assert headers["www-authenticate"].startswith('Bearer realm="kiln intake"'), headers
        assert "write scope" in text

        status, _, text = request(port, ctx, "POST", path, body,
                                  {**csv, "Authorization": f"Bearer {tokens['viewer']}"})
        assert status == 403 and "token viewer has scope read" in text, text

        bad = tokens["ci"][:-1] + ("0" if tokens["ci"][-1] != "0" else "1")
        status, _, text = request(port, ctx, "POST", path, body,
                                  {**csv, "Authorization": f"Bearer {bad}"})
        assert status == 401 and bad not in text, text

        write = {"Authorization": f"Bearer {tokens['ci']}"}
        for browser in ({**csv, "Origin": "https://evil.example"},
                        {"Content-Type": "application/x-www-form-urlencoded"},
                        {"Content-Type": "text/plain"}):
            status, _, text = request(port, ctx, "POST", path, body, {**browser, **write})
            assert status == 403 and "refuses writes from browsers" in text, (browser, text)

        status, _, text = request(port, ctx, "POST", path, body, {**csv, **write})
        assert status == 200, text
        reg = json.loads(text)
        assert reg["nodes"] == 2 and len(reg["queued"]) == 2, reg

        # curl, a client of its own, trusting the CA.
        curl = subprocess.run(
            ["curl", "-sS", "--max-time", "20", "--cacert", str(pki / "ca" / "ca.crt"),
             "-H", "Content-Type: text/csv", "-H", f"Authorization: Bearer {tokens['ci']}",
             "--data-binary", MANIFEST.format(rack="rack-curl").replace("gpu-w-", "gpu-c-"),
             "-w", "\n%{http_code}", f"https://127.0.0.1:{port}/v1/racks/rack-curl/manifest"],
            capture_output=True, text=True, timeout=30)
        assert curl.stdout.rsplit("\n", 1)[-1] == "200", curl.stdout + curl.stderr
        assert len(json.loads(curl.stdout.rsplit("\n", 1)[0])["queued"]) == 2

        # A plaintext client gets no HTTP answer from the HTTPS port.
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        with pytest.raises((OSError, http.client.HTTPException)):
            plain.request("GET", "/healthz")
            plain.getresponse().read()
        plain.close()

        # Revoked: refused within a few seconds, no restart.
        kiln("tokens", "revoke", "ci", "--file", str(tokens_file))
        deadline = time.monotonic() + 10
        while request(port, ctx, "POST", path, body, {**csv, **write})[0] != 401:
            assert time.monotonic() < deadline, "a revoked token still works"
            time.sleep(0.2)
        assert proc.poll() is None
    finally:
        stop(proc)
    text = log.read_text()
    assert "by=token ci" in text and "manifest registered" in text, text[-4000:]
    assert "refused a request without a token" in text
    for token in (*tokens.values(), bad):
        assert token not in text and token[5:] not in text, "a token reached the log"


@pytest.mark.timeout(60)
def test_services_refuse_to_start_open_on_the_network(tmp_path):
    db_url = f"sqlite://{tmp_path / 'kiln.db'}"
    for service in (["intake", "serve"], ["dashboard", "--no-lag"]):
        cp = kiln(*service, "--listen", f"0.0.0.0:{free_port()}", "--database-url", db_url,
                  check=False)
        assert cp.returncode != 0, cp
        assert "--tokens-file" in cp.stderr and "--insecure-no-auth" in cp.stderr, cp.stderr
    # A token file that is not one stops the service with the line and field.
    bad = tmp_path / "tokens"
    bad.write_text("ops read kiln_0123\n")
    cp = kiln("dashboard", "--no-lag", "--listen", "127.0.0.1:0", "--database-url", db_url,
              "--tokens-file", str(bad), check=False)
    assert cp.returncode != 0 and "line 1: hash" in cp.stderr, cp.stderr
    assert "kiln_0123" not in cp.stderr


def start_dashboard(tmp_path: Path, name: str, flags: list[str]) -> tuple[subprocess.Popen, int, Path]:
    db_url = f"sqlite://{tmp_path / 'kiln.db'}"
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [kiln_bin(), "dashboard", "--no-lag", "--listen", "127.0.0.1:0",
             "--database-url", db_url, *flags],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=clean_env())
    line = proc.stdout.readline().decode()
    m = re.search(r"https://127\.0\.0\.1:(\d+)/", line)
    assert m, f"no listening line: {line!r}\n{log.read_text()}"
    return proc, int(m.group(1)), log


@pytest.mark.timeout(120)
def test_dashboard_asks_browsers_to_log_in_with_a_read_token(pki, tmp_path):
    tokens_file = tmp_path / "tokens"
    tokens = make_tokens(tokens_file)
    proc, port, log = start_dashboard(tmp_path, "dashboard",
                                      [*https_flags(pki), "--tokens-file", str(tokens_file)])
    ctx = tls_context(pki)
    try:
        assert request(port, ctx, "GET", "/healthz")[0] == 200
        status, headers, _ = request(port, ctx, "GET", "/")
        assert status == 401
        assert headers["www-authenticate"].startswith('Basic realm="kiln dashboard"'), headers
        basic = base64.b64encode(f"operator:{tokens['viewer']}".encode()).decode()
        status, _, page = request(port, ctx, "GET", "/", headers={"Authorization": f"Basic {basic}"})
        assert status == 200 and "<html" in page.lower(), page[:500]
        status, _, _ = request(port, ctx, "GET", "/dead-letters",
                               headers={"Authorization": f"Bearer {tokens['viewer']}"})
        assert status == 200
        status, _, text = request(port, ctx, "GET", "/",
                                  headers={"Authorization": f"Bearer {tokens['ci']}"})
        assert status == 403 and "needs read" in text, text

        # SIGHUP reads the certificate again; the dashboard keeps serving.
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reloaded the HTTPS listener's TLS certificate" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        status, _, _ = request(port, ctx, "GET", "/", headers={"Authorization": f"Basic {basic}"})
        assert status == 200 and proc.poll() is None
    finally:
        stop(proc)
    text = log.read_text()
    assert all(t not in text for t in tokens.values()), "a token reached the log"


@pytest.mark.timeout(120)
def test_dashboard_with_client_certificates_refuses_clients_without_one(pki, tmp_path):
    proc, port, log = start_dashboard(
        tmp_path, "dashboard-mtls",
        [*https_flags(pki), "--https-client-ca", str(pki / "ca" / "ca.crt")])
    try:
        status, _, page = request(port, tls_context(pki, "ops"), "GET", "/")
        assert status == 200 and "<html" in page.lower()
        for ctx in (tls_context(pki), tls_context(pki, "old")):
            with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
                request(port, ctx, "GET", "/")
        # The open path is behind the handshake too: the certificate is the login.
        with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
            request(port, tls_context(pki), "GET", "/healthz")
        assert request(port, tls_context(pki, "ops"), "GET", "/healthz")[0] == 200
        assert proc.poll() is None
    finally:
        stop(proc)
    assert "refused a client: TLS handshake failed" in log.read_text(), log.read_text()[-3000:]
