"""A small static HTTP server for the rack's bridge address: the stand-in NVIDIA repo at `/nvidia/` (and any other
directory mapped under a prefix). Run as its own process: `python -m provisioner_testbed.serve --listen ADDR:PORT
--map /nvidia/=DIR ...`; `start()` launches it detached and tracked.
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
    a = ap.parse_args(argv)
    addr, _, port = a.listen.rpartition(":")
    mapping = {}
    for m in a.map:
        prefix, _, d = m.partition("=")
        mapping[prefix] = Path(d)
    handler = type("MappedHandler", (Handler,), {"mapping": mapping})
    httpd = ThreadingHTTPServer((addr, int(port)), partial(handler, directory="/nonexistent"))
    httpd.daemon_threads = True
    httpd.serve_forever()
    return 0


def start(listen: str, mapping: dict[str, Path], log: Path, *, tag: Path | None = None) -> Proc:
    """Start the server detached (own session); wait until it accepts connections; return it."""
    import socket

    args = [sys.executable, "-m", "provisioner_testbed.serve", "--listen", listen]
    for prefix, d in mapping.items():
        args += ["--map", f"{prefix}={d}"]
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
