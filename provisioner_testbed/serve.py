"""A small static HTTP server for the rack's bridge address: the stand-in NVIDIA repo at `/nvidia/` (and any other
directory mapped under a prefix), plain HTTP on PORT and, with a certificate, the same over HTTPS on TLS_PORT (what
the rack's inventory points the roles at: a site serves its mirror over TLS). Run as its own process: `python -m
provisioner_testbed.serve --listen ADDR:PORT --map /nvidia/=DIR [--tls-listen ADDR:PORT --tls-dir DIR]`; `start()`
launches it detached and tracked.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from provisioner_testbed.state import Proc

PORT = 8090
TLS_PORT = 8091


def resolve_path(mapping: dict[str, Path], url_path: str) -> Path | None:
    """The file a URL path names under the mapped prefixes (longest prefix wins), or None (pure; no escapes)."""
    path = unquote(urlsplit(url_path).path)
    for prefix in sorted(mapping, key=len, reverse=True):
        if path.startswith(prefix):
            root = mapping[prefix].resolve()
            rel = path[len(prefix):].lstrip("/")
            parts = [p for p in rel.split("/") if p not in ("", ".")]
            if ".." in parts:
                return None
            return root.joinpath(*parts)
    return None


class Handler(SimpleHTTPRequestHandler):
    mapping: dict[str, Path] = {}
    server_version = "provisioner-testbed"

    def translate_path(self, path: str) -> str:
        p = resolve_path(self.mapping, path)
        return str(p) if p is not None else "/nonexistent/provisioner-testbed"

    def list_directory(self, path: str | os.PathLike[str]):  # type: ignore[override]
        self.send_error(403, "no listings")
        return None

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {self.address_string()} {format % args}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="provisioner_testbed.serve")
    ap.add_argument("--listen", required=True, help="ADDR:PORT")
    ap.add_argument("--map", action="append", default=[], help="/prefix/=DIR")
    ap.add_argument("--tag", default="", help="the rack directory (lets `down` find this process after a crash)")
    ap.add_argument("--tls-listen", default="", help="ADDR:PORT for HTTPS (needs --tls-dir)")
    ap.add_argument("--tls-dir", default="", help="holds server.pem and server.key (provisioner_testbed.tls)")
    a = ap.parse_args(argv)
    mapping = {}
    for m in a.map:
        prefix, _, d = m.partition("=")
        mapping[prefix] = Path(d)
    handler = partial(type("MappedHandler", (Handler,), {"mapping": mapping}), directory="/nonexistent")
    addr, _, port = a.listen.rpartition(":")
    # the plain port listens last: start() waits for it, so the HTTPS one is ready by then
    servers = [ThreadingHTTPServer((addr, int(port)), handler, bind_and_activate=False)]
    if a.tls_listen:
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(Path(a.tls_dir) / "server.pem", Path(a.tls_dir) / "server.key")
        taddr, _, tport = a.tls_listen.rpartition(":")
        https = ThreadingHTTPServer((taddr, int(tport)), handler, bind_and_activate=False)
        https.socket = ctx.wrap_socket(https.socket, server_side=True)
        https.server_bind()
        https.server_activate()
        servers.append(https)
    servers[0].server_bind()
    servers[0].server_activate()
    import threading

    for srv in servers:
        srv.daemon_threads = True
    for srv in servers[1:]:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    servers[0].serve_forever()
    return 0


def start(listen: str, mapping: dict[str, Path], log: Path, *, tag: Path | None = None,
          tls: tuple[str, Path] | None = None) -> Proc:
    """Start the server detached (own session); wait until it accepts connections; return it. `tls`: (ADDR:PORT,
    the directory of its certificate and key) to serve the same over HTTPS too."""
    import socket

    args = [sys.executable, "-m", "provisioner_testbed.serve", "--listen", listen]
    for prefix, d in mapping.items():
        args += ["--map", f"{prefix}={d}"]
    if tls is not None:
        args += ["--tls-listen", tls[0], "--tls-dir", str(tls[1])]
    if tag is not None:
        args += ["--tag", f"{tag}/"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, start_new_session=True,
                             cwd="/")
    proc = Proc.of(p.pid)
    addr, _, port = listen.rpartition(":")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if p.poll() is not None:
            break
        try:
            socket.create_connection((addr, int(port)), timeout=0.5).close()
            if proc is not None:
                return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the repo HTTP server on {listen} did not start (see {log})")


if __name__ == "__main__":
    raise SystemExit(main())
