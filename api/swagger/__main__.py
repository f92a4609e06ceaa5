"""`python -m api.swagger --update VERSION`: a maintainer's step, replacing the Swagger UI files
beside api/swagger/__init__.py with another `swagger-ui-dist` version from npm."""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from api.swagger import FILES, LICENCE_FILES


def update(version: str) -> int:
    """Replace the files beside this module with `swagger-ui-dist@version` from npm, and print the
    `VERSION` and `FILES` to paste above."""
    npm = shutil.which("npm")
    if npm is None:
        print("npm is needed: apt-get install npm", file=sys.stderr)
        return 1
    here = Path(__file__).parent
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([npm, "pack", f"swagger-ui-dist@{version}", "--silent"], cwd=work, check=True, timeout=300)
        with tarfile.open(Path(work) / f"swagger-ui-dist-{version}.tgz", "r:gz") as tar:
            for name in (*FILES, *LICENCE_FILES):
                member = tar.extractfile(f"package/{name}")
                if member is None:
                    print(f"swagger-ui-dist@{version} has no {name}", file=sys.stderr)
                    return 1
                (here / name).write_bytes(member.read())
    print(f'VERSION = "{version}"')
    for name in FILES:
        print(f"{name}: {hashlib.sha256((here / name).read_bytes()).hexdigest()}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m api.swagger",
                                     description="Vendor another swagger-ui-dist version into api/swagger/.")
    parser.add_argument("--update", metavar="VERSION", required=True, help="swagger-ui-dist version to vendor")
    sys.exit(update(parser.parse_args().update))
