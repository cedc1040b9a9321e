"""Regenerate the Python code for every .proto in this folder.

One command (`make protos`, or `python -m protos.generate`); `--check`
regenerates into a temporary folder and fails when the committed files differ,
which CI runs so the generated code can never drift from the contracts.
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def generate(out_root: Path) -> list[Path]:
    protos = sorted(HERE.glob("*.proto"))
    include = Path(protoc.__file__).resolve().parent / "_proto"
    for proto in protos:
        rel = proto.relative_to(ROOT)
        rc = protoc.main([
            "grpc_tools.protoc", f"-I{ROOT}", f"-I{include}",
            f"--python_out={out_root}", f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", str(rel),
        ])
        if rc != 0:
            raise SystemExit(f"protoc failed on {rel}")
    return sorted(p for p in (out_root / "protos").glob("*_pb2*.py*"))


def main(argv: list[str]) -> int:
    if "--check" not in argv:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [p.name for p in fresh if not (HERE / p.name).exists() or not filecmp.cmp(p, HERE / p.name, shallow=False)]
        extra = {p.name for p in HERE.glob("*_pb2*.py*")} - {p.name for p in fresh}
        if stale or extra:
            print(f"generated protos are stale: {sorted(stale + list(extra))}; run `make protos`", file=sys.stderr)
            return 1
    print("generated protos are current")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
