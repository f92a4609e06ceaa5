"""A stand-in `kokoro-fleet` command for tests of what runs it (docker/entrypoint.sh, modal_app.py's
container side): `weights` reports weights that are ready, `serve` runs a small Python script in
place of the server, so those tests check their own logic in seconds, apart from the real server."""

from __future__ import annotations

import sys
from pathlib import Path


def install_fake_kokoro_fleet(bin_dir: Path, serve_script: str) -> Path:
    """Write `kokoro-fleet` (and `serve_script` beside it) into `bin_dir`; put that on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    server = bin_dir / "fake_serve.py"
    server.write_text(serve_script)
    fleet = bin_dir / "kokoro-fleet"
    fleet.write_text(f"""#!/usr/bin/env bash
case "$1" in
    weights) echo '{{"source": "tiny"}}' ;;
    serve) shift; exec {sys.executable} {server} "$@" ;;
esac
""")
    fleet.chmod(0o755)
    return fleet
