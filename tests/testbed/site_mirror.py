"""A site with its own mirror, CA and proxy, on the controller, for tests/testbed/test_site_trust.py.

- `make_ca(dir)`: a site CA and a server certificate for `mirror.site.test` signed by it (openssl CLI).
- `make_wheel(dir, name, version)`: a tiny pure-Python wheel (a module with VERSION), built by hand (zipfile).
- `SiteMirror`: a PEP 503 simple index over HTTPS with that certificate, bound to 127.0.0.1 only (the rack's hosts
  cannot reach the controller's loopback: only the proxy below can).
- `ConnectProxy`: a forward proxy that answers only CONNECT, bound on the rack's bridge address, requires basic
  proxy credentials, logs every CONNECT target with the client's address, and maps `mirror.site.test:443` to the
  mirror's loopback port. Anything else: 403.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import select
import socket
import socketserver
import ssl
import subprocess
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

MIRROR_NAME = "mirror.site.test"


@dataclass(frozen=True)
class Pki:
    ca_pem: Path
    server_cert: Path
    server_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True)


def make_ca(d: Path, name: str = MIRROR_NAME) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/O=provisioner test site/CN=Site Test Root CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", f"/CN={name}", cwd=d)
    (d / "ext.cnf").write_text(f"subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return Pki(ca_pem=d / "ca.pem", server_cert=d / "server.pem", server_key=d / "server.key")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(d: Path, name: str, version: str) -> Path:
    """`<name>-<version>-py3-none-any.whl` with module `<name>` (VERSION = version)."""
    d.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f'VERSION = "{version}"\n'.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: test wheel\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: provisioner-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{p},{_record_hash(b)},{len(b)}\n" for p, b in files.items()) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record.encode()
    out = d / f"{name}-{version}-py3-none-any.whl"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p, b in files.items():
            z.writestr(p, b)
    out.write_bytes(buf.getvalue())
    return out


def _index_html(links: list[tuple[str, str]]) -> bytes:
    body = "".join(f'<a href="{href}">{text}</a><br>\n' for href, text in links)
    return f"<!DOCTYPE html><html><body>\n{body}</body></html>\n".encode()


class SiteMirror:
    """PEP 503 simple index (`/simple/`, `/simple/<name>/`, `/files/<wheel>`) over HTTPS on 127.0.0.1."""

    def __init__(self, pki: Pki, wheels: list[Path]) -> None:
        self.requests: list[str] = []
        pages: dict[str, tuple[str, bytes]] = {}
        projects: dict[str, list[Path]] = {}
        for w in wheels:
            projects.setdefault(w.name.split("-")[0].replace("_", "-").lower(), []).append(w)
            pages[f"/files/{w.name}"] = ("application/octet-stream", w.read_bytes())
        pages["/simple/"] = ("text/html", _index_html([(f"{p}/", p) for p in sorted(projects)]))
        for p, ws in projects.items():
            pages[f"/simple/{p}/"] = ("text/html", _index_html(
                [(f"../../files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}", w.name) for w in ws]))
        log = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                log.append(self.path)
                page = pages.get(self.path.split("?")[0])
                if page is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", page[0])
                self.send_header("Content-Length", str(len(page[1])))
                self.end_headers()
                self.wfile.write(page[1])

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(pki.server_cert), str(pki.server_key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ConnectProxy:
    """CONNECT-only forward proxy with basic proxy credentials; `log` holds "CONNECT host:port from ip [status]"."""

    def __init__(self, listen: str, routes: dict[str, tuple[str, int]], user: str, password: str) -> None:
        self.log: list[str] = []
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        log = self.log

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.settimeout(30)
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 65536:
                    chunk = sock.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
                parts = head[0].split()
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
                client = self.client_address[0]
                if len(parts) != 3 or parts[0] != "CONNECT":
                    log.append(f"{parts[0] if parts else '?'} {parts[1] if len(parts) > 1 else '?'} from {client} 405")
                    sock.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                    return
                target = parts[1]
                if headers.get("proxy-authorization") != expected:
                    log.append(f"CONNECT {target} from {client} 407")
                    sock.sendall(b'HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="site"'
                                 b"\r\nContent-Length: 0\r\n\r\n")
                    return
                if target not in routes:
                    log.append(f"CONNECT {target} from {client} 403")
                    sock.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                    return
                up = socket.create_connection(routes[target], timeout=10)
                log.append(f"CONNECT {target} from {client} 200")
                sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                try:
                    _pipe(sock, up)
                finally:
                    up.close()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server((listen, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{listen}:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    a.settimeout(None)
    b.settimeout(None)
    socks = [a, b]
    while True:
        readable, _, _ = select.select(socks, [], [], 60)
        if not readable:
            return
        for s in readable:
            try:
                data = s.recv(65536)
                if data:
                    (b if s is a else a).sendall(data)
            except OSError:  # a reset by either side ends the tunnel
                return
            if not data:
                return
