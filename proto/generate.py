"""Generate the Python code for ``proto/v1/*.proto``: ``python -m vesper.proto.generate``.

The .proto files are compiled under the virtual path ``vesper/proto/v1`` so the
generated modules import each other as ``vesper.proto.v1.*``. ``--check`` compiles
into a scratch folder and fails if the committed files differ (a stale checkout).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent / "v1"
VIRTUAL_ROOT = "vesper/proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def compile_into(out_dir: Path) -> list[Path]:
    """Compile every .proto into out_dir/vesper/proto/v1 and return the generated files."""
    from grpc_tools import protoc  # only needed by developers, not at run time

    sources = [f"{VIRTUAL_ROOT}/v1/{p.name}" for p in proto_files()]
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{VIRTUAL_ROOT}={PROTO_DIR.parent}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    generated = out_dir / VIRTUAL_ROOT / "v1"
    return sorted(p for p in generated.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def committed_files() -> list[Path]:
    return sorted(p for p in PROTO_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def stale_files() -> list[str]:
    """Names of generated files that are missing, extra or different from a fresh compile."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in compile_into(Path(tmp))}
        have = {p.name: p for p in committed_files()}
        names = sorted(set(fresh) | set(have))
        return [
            n
            for n in names
            if n not in fresh or n not in have or not filecmp.cmp(fresh[n], have[n], shallow=False)
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print("stale generated code: " + ", ".join(stale), file=sys.stderr)
            print("run: python -m vesper.proto.generate", file=sys.stderr)
            return 1
        print("generated code is up to date")
        return 0
    for old in committed_files():
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        for path in compile_into(Path(tmp)):
            shutil.copy2(path, PROTO_DIR / path.name)
            print(f"wrote {PROTO_DIR / path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
