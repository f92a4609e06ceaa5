"""A package index on 127.0.0.1 that serves torch's CPU wheels from a local folder and sends every
other project to PyPI: the same answers PyTorch's CPU index gives, for a builder that reaches PyPI
but not download.pytorch.org (docker/build-local.sh passes it as TORCH_CPU_INDEX_URL).

    python3 docker/local_torch_index.py WHEEL_DIR [--port N]

Prints the index URL on its first line, then serves until killed.
"""

from __future__ import annotations

import argparse
import html
import sys
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

PYPI_SIMPLE = "https://pypi.org/simple"


class IndexHandler(BaseHTTPRequestHandler):
    def __init__(self, *args, wheels: dict[str, Path], **kwargs):
        self.wheels = wheels
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        parts = [unquote(p) for p in self.path.split("?")[0].split("/") if p]
        if parts == ["simple", "torch"]:
            links = "".join(f'<a href="/files/{html.escape(name)}">{html.escape(name)}</a>\n' for name in sorted(self.wheels))
            self.answer(200, "text/html", f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode())
        elif len(parts) == 2 and parts[0] == "files" and parts[1] in self.wheels:
            path = self.wheels[parts[1]]
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(path.stat().st_size))
            self.end_headers()
            with path.open("rb") as wheel:
                while block := wheel.read(1 << 20):
                    self.wfile.write(block)
        elif len(parts) == 2 and parts[0] == "simple":
            self.send_response(302)
            self.send_header("Location", f"{PYPI_SIMPLE}/{parts[1]}/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.answer(404, "text/plain", b"not found\n")

    def answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
        sys.stderr.write("local_torch_index: " + format % args + "\n")


def bind(wheel_dir: Path, port: int) -> ThreadingHTTPServer:
    """The preferred port when free (a stable URL keeps Docker's layer cache valid), else any."""
    wheels = {p.name: p for p in wheel_dir.glob("torch-*.whl")}
    if not wheels:
        sys.exit(f"local_torch_index: no torch-*.whl in {wheel_dir}")
    handler = partial(IndexHandler, wheels=wheels)
    try:
        return ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        return ThreadingHTTPServer(("127.0.0.1", 0), handler)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel_dir", type=Path)
    parser.add_argument("--port", type=int, default=41773)
    args = parser.parse_args()
    server = bind(args.wheel_dir, args.port)
    print(f"http://127.0.0.1:{server.server_address[1]}/simple", flush=True)
    server.serve_forever()
