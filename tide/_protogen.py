"""Generate the protobuf/gRPC modules (and their type stubs) for protos/.

``python -m tide._protogen OUT_DIR [PROTO_DIR]`` writes ``OUT_DIR/<name>_pb2.py``,
``_pb2.pyi``, ``_pb2_grpc.py`` and ``_pb2_grpc.pyi`` for every ``protos/PROTO_DIR/*.proto``
(PROTO_DIR: ``tide/v1`` unless given). ``make protos`` runs it into ``tide/v1`` and, for
``apache/rocketmq/v2`` (the RocketMQ 5 protocol the gateway also serves), into
``tide/rocketmq_v2``; the freshness test runs both into temporary directories and compares
byte for byte.

The RocketMQ modules' imports of each other are rewritten from ``apache.rocketmq.v2`` to
``tide.rocketmq_v2``: no top-level ``apache`` package ships with Tide (the official
clients bring their own).
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent.parent / "protos"
PACKAGE_DIR = "tide/v1"
ROCKETMQ_DIR = "apache/rocketmq/v2"
# proto directory -> the Python package its modules are imported as.
PYTHON_PACKAGES = {PACKAGE_DIR: "tide.v1", ROCKETMQ_DIR: "tide.rocketmq_v2"}


def proto_files(proto_dir: str = PACKAGE_DIR) -> list[Path]:
    return sorted((PROTO_ROOT / proto_dir).glob("*.proto"))


def generate(out_dir: Path, proto_dir: str = PACKAGE_DIR) -> list[Path]:
    """Generate ``protos/<proto_dir>`` into ``out_dir`` (the package directory itself);
    return the files written."""
    from grpc_tools import protoc  # dev dependency, imported only here

    bin_dir = Path(sys.executable).parent
    # protoc's own well-known types (google/protobuf/*.proto), shipped with grpcio-tools.
    well_known = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *(str(p.relative_to(PROTO_ROOT)) for p in proto_files(proto_dir)),
        ]
        code = protoc.main(args)
        if code != 0:
            raise SystemExit(f"protoc failed with exit code {code}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / proto_dir).iterdir()):
            dst = out_dir / src.name
            if proto_dir == PACKAGE_DIR:
                shutil.copyfile(src, dst)
            else:
                dst.write_text(_rehome(src.read_text(), proto_dir), encoding="utf-8")
            written.append(dst)
        return written


def _rehome(code: str, proto_dir: str) -> str:
    """Import the generated siblings from their Tide package, not from the proto's own."""
    proto_package = proto_dir.replace("/", ".")
    package = PYTHON_PACKAGES[proto_dir]
    code = code.replace(f"from {proto_package} import", f"from {package} import")
    code = code.replace(f"import {proto_package}.", f"import {package}.")
    # The classes' __module__ (the descriptors' full names keep the proto package).
    return re.sub(rf"'{re.escape(proto_package)}\.(\w+_pb2)'", rf"'{package}.\1'", code)


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: python -m tide._protogen OUT_DIR [PROTO_DIR]")
    proto_dir = sys.argv[2] if len(sys.argv) == 3 else PACKAGE_DIR
    if proto_dir not in PYTHON_PACKAGES:
        raise SystemExit(f"PROTO_DIR: one of {', '.join(PYTHON_PACKAGES)}, not {proto_dir!r}")
    for path in generate(Path(sys.argv[1]), proto_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
