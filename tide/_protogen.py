"""Generate the protobuf/gRPC modules (and their type stubs) for protos/.

``python -m tide._protogen OUT_DIR`` writes ``OUT_DIR/<name>_pb2.py``, ``_pb2.pyi``,
``_pb2_grpc.py`` and ``_pb2_grpc.pyi`` for every ``protos/tide/v1/*.proto``. ``make protos``
runs it into ``tide/v1``; the freshness test runs it into a temporary directory and
compares byte for byte.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent.parent / "protos"
PACKAGE_DIR = "tide/v1"


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Generate into ``out_dir`` (the package directory itself); return the files written."""
    from grpc_tools import protoc  # dev dependency, imported only here

    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
        ]
        code = protoc.main(args)
        if code != 0:
            raise SystemExit(f"protoc failed with exit code {code}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / PACKAGE_DIR).iterdir()):
            dst = out_dir / src.name
            shutil.copyfile(src, dst)
            written.append(dst)
        return written


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tide._protogen OUT_DIR")
    for path in generate(Path(sys.argv[1])):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
