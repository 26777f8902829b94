"""Deskbox behind nginx terminating TLS, set up as docs/nginx-deskbox.conf says.

The file is run as it is but for its listen address, its certificate and the server's port
(each replaced once: a change to those lines of the document fails here). A real ``deskbox
serve`` (container engine) on loopback, Debian's nginx in front of it (its binary alone,
scripts/nginx.sh), and a certificate authority of the test's own. Everything a client does
goes through the proxy: REST over https; the session's URLs, which must say https:// and
wss:// with the proxy's address; the actions websocket; the live view's page, its VNC
websocket, and the page in a headless Chromium, connected; Playwright over CDP; the event
stream as events happen; and uploads, which stream through, and past the server's cap get
the server's JSON 413, not nginx's page nor its 502.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from playwright.sync_api import sync_playwright
from websockets.sync.client import connect

from deskbox import APIConnectionError, AsyncDeskbox, Deskbox

from ..cdp_page import CdpPage
from ..headless import headless_chromium
from .helpers import assert_error, decode, token_for
from .sandbox_page import events_data_url
from .served import KEY, free_port, serve

pytestmark = pytest.mark.slow

NGINX = Path(os.environ.get("DESKBOX_NGINX_ROOT", "/opt/deskbox/nginx-root")) / "usr/sbin/nginx"
DOCUMENTED = Path(__file__).resolve().parents[2] / "docs" / "nginx-deskbox.conf"
HOST = "127.0.0.1"
FILE_MAX = 2 * 1024 * 1024  # the server's DESKBOX_FILE_MAX_BYTES here
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class Proxied:
    directory: Path  # nginx's configuration and logs
    client: httpx.Client  # https through nginx, with the API key
    tls: ssl.SSLContext  # trusts the test's authority only
    authority: Path  # its certificate (PEM)
    certificate: Path  # the proxy's (PEM)
    base: str  # https://HOST:PORT of the proxy


def certificates(directory: Path) -> tuple[Path, Path, Path]:
    """An authority, and a certificate it signed for HOST: their PEM files and the key's."""
    now = datetime.datetime.now(datetime.UTC)
    span = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))

    def issued(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str,
               signer: ec.EllipticCurvePrivateKey, authority: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(span[0]).not_valid_after(span[1])
                   .add_extension(x509.BasicConstraints(ca=authority, path_length=None),
                                  critical=True))
        if not authority:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]),
                critical=False)
        return builder.sign(signer, hashes.SHA256())

    authority_key = ec.generate_private_key(ec.SECP256R1())
    server_key = ec.generate_private_key(ec.SECP256R1())
    authority = issued("deskbox test authority", authority_key, "deskbox test authority",
                       authority_key, True)
    server = issued(HOST, server_key, "deskbox test authority", authority_key, False)
    paths = directory / "authority.pem", directory / "fullchain.pem", directory / "privkey.pem"
    paths[0].write_bytes(authority.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return paths


def nginx_conf(directory: Path, listen_port: int, server_port: int, cert: Path,
               key: Path) -> Path:
    """The documented server block, placed in a main configuration of the test's."""
    site = DOCUMENTED.read_text()
    for documented, here in {
        "listen 443 ssl;": f"listen {HOST}:{listen_port} ssl;",
        "proxy_pass http://127.0.0.1:8765;": f"proxy_pass http://127.0.0.1:{server_port};",
        "/etc/ssl/deskbox/fullchain.pem": str(cert),
        "/etc/ssl/deskbox/privkey.pem": str(key),
        "/var/log/nginx/deskbox.access.log": str(directory / "deskbox.access.log"),
    }.items():
        assert site.count(documented) == 1, f"{DOCUMENTED.name} no longer has {documented!r}"
        site = site.replace(documented, here)
    (directory / "deskbox.conf").write_text(site)
    temp = {name: directory / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    main = directory / "nginx.conf"
    # user root: the test's files lie in a directory only root may enter.
    main.write_text(f"""
user root;
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log {directory}/access.log;
    client_body_temp_path {temp['body']};
    proxy_temp_path {temp['proxy']};
    fastcgi_temp_path {temp['fastcgi']};
    uwsgi_temp_path {temp['uwsgi']};
    scgi_temp_path {temp['scgi']};
    include {directory}/deskbox.conf;
}}
""")
    return main


def wait_listening(port: int, nginx: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        assert nginx.poll() is None, log.read_text() if log.exists() else "nginx exited"
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "nginx did not listen"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    assert NGINX.exists(), f"{NGINX} is missing: scripts/nginx.sh installs it (make setup)"
    directory = tmp_path_factory.mktemp("tls")
    authority, cert, key = certificates(directory)
    with serve(directory / "state", directory / "server.log",
               {"DESKBOX_FILE_MAX_BYTES": str(FILE_MAX)}) as (_, direct):
        port = free_port()
        assert direct.base_url.port is not None
        conf = nginx_conf(directory, port, direct.base_url.port, cert, key)
        nginx = subprocess.Popen([str(NGINX), "-p", str(directory), "-c", str(conf),
                                  "-e", str(directory / "error.log"), "-g", "daemon off;"])
        try:
            wait_listening(port, nginx, directory / "error.log")
            tls = ssl.create_default_context(cafile=str(authority))
            base = f"https://{HOST}:{port}"
            with httpx.Client(base_url=base, verify=tls, headers=AUTH, timeout=60) as client:
                yield Proxied(directory, client, tls, authority, cert, base)
        finally:
            nginx.terminate()
            nginx.wait(timeout=10)


@pytest.fixture(scope="module")
def session(proxied: Proxied) -> Iterator[dict[str, Any]]:
    response = proxied.client.post("/v1/sessions",
                                   json={"browser": {"start_url": events_data_url()}})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    try:
        yield body
    finally:
        proxied.client.delete(f"/v1/sessions/{body['id']}")


def test_a_session_made_through_the_proxy_names_the_proxy_in_its_urls(
    proxied: Proxied, session: dict[str, Any]
) -> None:
    assert session["state"] == "running" and session["backend"] == "container"
    wss = "wss" + proxied.base.removeprefix("https")
    path = f"/v1/sessions/{session['id']}"
    assert session["urls"] == {
        "actions_ws": f"{wss}{path}/actions/ws", "vnc_ws": f"{wss}{path}/vnc",
        "view": f"{proxied.base}{path}/view", "cdp_http": f"{proxied.base}{path}/cdp",
        "cdp_ws": f"{wss}{path}/cdp",
    }
    assert proxied.client.get("/healthz").status_code == 200


def test_the_actions_websocket(proxied: Proxied, session: dict[str, Any]) -> None:
    with connect(session["urls"]["actions_ws"], ssl=proxied.tls, additional_headers=AUTH,
                 open_timeout=10) as ws:
        ws.send(json.dumps({"id": 1, "action": {"type": "click", "x": 200, "y": 200}}))
        assert json.loads(ws.recv(timeout=20))["ok"] is True
        ws.send(json.dumps({"id": 2, "action": {"type": "screenshot", "format": "png"}}))
        reply = json.loads(ws.recv(timeout=20))
        assert reply["ok"] is True and reply["binary_frames"] == 1, reply
        image = ws.recv(timeout=20)
    assert isinstance(image, bytes) and decode(image).size == (1280, 800)


def test_the_live_view_and_its_vnc_websocket(proxied: Proxied, session: dict[str, Any]) -> None:
    view = token_for(proxied.client, session["id"], "view")
    page = httpx.get(f"{session['urls']['view']}?token={view}", verify=proxied.tls)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    with connect(f"{session['urls']['vnc_ws']}?token={view}", ssl=proxied.tls,
                 open_timeout=10) as ws:
        assert ws.recv(timeout=10) == b"RFB 003.008\n"


def test_the_live_view_page_in_chromium(
    tmp_path: Path, proxied: Proxied, session: dict[str, Any]
) -> None:
    """The page as a person opens it over https: noVNC's websocket must then be wss (a
    browser refuses ws:// from an https page), through the proxy, to the desktop."""
    pinned = base64.b64encode(hashlib.sha256(x509.load_pem_x509_certificate(
        proxied.certificate.read_bytes()).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo,
        )).digest()).decode()
    link = f"{session['urls']['view']}?token={token_for(proxied.client, session['id'], 'view')}"
    # Chromium trusts exactly the proxy's certificate (its key's hash), nothing else.
    with headless_chromium(tmp_path / "viewer",
                           extra_args=[f"--ignore-certificate-errors-spki-list={pinned}"]
                           ) as devtools, CdpPage.first(devtools) as cdp:
        cdp.navigate(link)
        deadline = time.monotonic() + 20
        shown = None
        while time.monotonic() < deadline:
            # noVNC makes its canvas once it connects: until then there is none.
            shown = cdp.evaluate("""window.__deskbox && [window.__deskbox.connected,
                document.getElementById('state').textContent,
                document.querySelector('#screen canvas')?.width, location.protocol]""")
            if shown and shown[0]:
                break
            time.sleep(0.1)
    assert shown == [True, "connected", 1280, "https:"], shown


def test_playwright_over_cdp(
    proxied: Proxied, session: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Playwright's driver (Node.js) trusts the test's authority through this.
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(proxied.authority))
    cdp = token_for(proxied.client, session["id"], "cdp")
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(
            f"{session['urls']['cdp_http']}?token={cdp}", timeout=20_000)
        try:
            [page] = [page for context in browser.contexts for page in context.pages]
            assert page.evaluate("6 * 7") == 42
        finally:
            browser.close()


def test_the_event_stream_arrives_as_events_happen(
    proxied: Proxied, session: dict[str, Any]
) -> None:
    """nginx's response buffering would hold events back (the server says not to)."""
    with proxied.client.stream("GET", f"/v1/sessions/{session['id']}/events",
                               timeout=20) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # the history
        started = time.monotonic()
        response = proxied.client.post(f"/v1/sessions/{session['id']}/recording/start")
        assert response.status_code == 200, response.text
        for line in lines:
            if line.startswith("data: ") and '"recording_started"' in line:
                break
        took = time.monotonic() - started
    proxied.client.post(f"/v1/sessions/{session['id']}/recording/stop")
    assert took < 3, took


def test_uploads_stream_through_and_the_cap_is_the_servers(
    proxied: Proxied, session: dict[str, Any]
) -> None:
    files = f"/v1/sessions/{session['id']}/files"
    data = os.urandom(FILE_MAX)
    response = proxied.client.put(files, params={"path": "/tmp/upload.bin"}, content=data)
    assert response.status_code == 200, response.text
    assert proxied.client.get(files, params={"path": "/tmp/upload.bin"}).content == data
    # Past the cap: the server's error body, where nginx's own limit would send its page.
    # nginx asks the server to close after each answer: the server reads the refused body
    # to its end first (closed on it, it was nginx's 502 in most tries).
    for _ in range(5):
        error = assert_error(
            proxied.client.put(files, params={"path": "/tmp/upload.bin"}, content=data * 4),
            413, "invalid_request")
        assert f"larger than {FILE_MAX} bytes" in error["message"], error


def test_the_sdk_trusts_the_authority_it_is_given_for_calls_and_websockets(
    proxied: Proxied, session: dict[str, Any]
) -> None:
    """One TLS context for the SDK's HTTP calls and its websocket: ``verify=`` a CA bundle;
    without it httpx's authorities (certifi's), which know nothing of a private one."""
    with Deskbox(proxied.base, KEY, verify=proxied.authority) as box:
        live = box.sessions.get(session["id"])
        with live.actions_ws() as socket:
            done = socket.act({"type": "click", "x": 300, "y": 300}, screenshot=True)
        assert done.screenshot is not None and done.screenshot.width == 1280
        assert live.screenshot().startswith(b"\x89PNG")

    async def through_async() -> int:
        async with AsyncDeskbox(proxied.base, KEY, verify=str(proxied.authority)) as box:
            live = await box.sessions.get(session["id"])
            async with live.actions_ws() as socket:
                done = await socket.act({"type": "screen_size"})
            return int(done.results[0]["width"])
    assert asyncio.run(through_async()) == 1280

    with Deskbox(proxied.base, KEY) as box, pytest.raises(APIConnectionError,
                                                         match="CERTIFICATE_VERIFY_FAILED"):
        box.sessions.get(session["id"])


def test_the_cli_trusts_ssl_cert_file(proxied: Proxied, session: dict[str, Any]) -> None:
    env = {**os.environ, "DESKBOX_URL": proxied.base, "DESKBOX_API_KEY": KEY,
           "SSL_CERT_FILE": str(proxied.authority)}
    cli = str(Path(sys.executable).parent / "deskbox")
    listed = subprocess.run([cli, "ls", "--json"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert session["id"] in [entry["id"] for entry in json.loads(listed.stdout)]


def test_no_token_reaches_the_proxys_access_log(proxied: Proxied) -> None:
    """Last: after the live view, its websocket and DevTools went through with tokens in
    their query strings, which nginx's usual format logged with the request line."""
    logged = (proxied.directory / "deskbox.access.log").read_text()
    assert "/view" in logged and "/vnc" in logged, logged[-2000:]
    assert "dbt_" not in logged and "token=" not in logged
