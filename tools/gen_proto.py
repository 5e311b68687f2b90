"""Regenerate the protobuf (and gRPC) Python modules from proto/.

Each `proto/<path>.proto` becomes `<path>_pb2.py` (+ `.pyi`, + `_pb2_grpc.py`
for files with services) at the same path under the repo root, so
`proto/feedlog/pb/hyperdb.proto` is imported as `feedlog.pb.hyperdb_pb2` with
no import rewriting. Generated code lives only in `feedlog/pb/`.

    python tools/gen_proto.py            # regenerate in place
    python tools/gen_proto.py --check    # exit 1 if the checked-in code is stale (CI)
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
OUT_PACKAGES = ("feedlog/pb",)


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc  # dev dependency: grpcio-tools

    protos = sorted(PROTO.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # grpc_python_out writes an (empty) *_pb2_grpc.py for every file; keep only real ones.
    for stub in out.rglob("*_pb2_grpc.py"):
        if "class " not in stub.read_text():
            stub.unlink()
    return sorted(p for p in out.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        files = generate(out)
        rel = {p.relative_to(out) for p in files}
        stale: list[str] = []
        for pkg in OUT_PACKAGES:
            current = {
                p.relative_to(ROOT)
                for p in (ROOT / pkg).glob("*")
                if p.is_file() and p.name != "__init__.py" and "_pb2" in p.name
            }
            for missing in sorted(current - rel):
                stale.append(f"{missing}: no longer generated")
        for r in sorted(rel):
            dst = ROOT / r
            if ns.check:
                if not dst.exists() or not filecmp.cmp(out / r, dst, shallow=False):
                    stale.append(f"{r}: differs from protoc output")
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(out / r, dst)
        if ns.check:
            if stale:
                print("generated protobuf code is stale; run `python tools/gen_proto.py`:", file=sys.stderr)
                for line in stale:
                    print("  " + line, file=sys.stderr)
                return 1
            print(f"generated protobuf code is up to date ({len(rel)} files)")
        else:
            for pkg in OUT_PACKAGES:
                init = ROOT / pkg / "__init__.py"
                if not init.exists():
                    init.write_text('"""Generated protobuf modules (tools/gen_proto.py). Do not edit."""\n')
            print(f"wrote {len(rel)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
