"""Regenerate the Python code for every .proto in this folder.

One command (`make protos`, or `python -m trainforge_protos.generate`); `--check`
regenerates into a temporary folder and fails when the committed files differ,
which CI runs so the generated code can never drift from the contracts.

The folder installs as the package `trainforge_protos`, so protoc sees it under
that name (a link in a temporary include folder): the .proto files import each
other as `trainforge_protos/<name>.proto` and the generated modules import
each other from `trainforge_protos`.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
PACKAGE = "trainforge_protos"


def generate(out_root: Path) -> list[Path]:
    """Generate every .proto's modules into `out_root/trainforge_protos/`; the generated files."""
    include = Path(protoc.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory() as src:
        (Path(src) / PACKAGE).symlink_to(HERE, target_is_directory=True)
        for proto in sorted(HERE.glob("*.proto")):
            rel = f"{PACKAGE}/{proto.name}"
            rc = protoc.main([
                "grpc_tools.protoc", f"-I{src}", f"-I{include}",
                f"--python_out={out_root}", f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", rel,
            ])
            if rc != 0:
                raise SystemExit(f"protoc failed on {rel}")
    return sorted(p for p in (out_root / PACKAGE).glob("*_pb2*.py*"))


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        if "--check" not in argv:
            for p in fresh:
                shutil.copyfile(p, HERE / p.name)
            return 0
        stale = [p.name for p in fresh if not (HERE / p.name).exists() or not filecmp.cmp(p, HERE / p.name, shallow=False)]
        extra = {p.name for p in HERE.glob("*_pb2*.py*")} - {p.name for p in fresh}
        if stale or extra:
            print(f"generated protos are stale: {sorted(stale + list(extra))}; run `make protos`", file=sys.stderr)
            return 1
    print("generated protos are current")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
