"""The generated code under tide/v1 and tide/rocketmq_v2 must match what protos/ generates
now."""

from __future__ import annotations

from pathlib import Path

import pytest

from tide import _protogen

ROOT = Path(_protogen.__file__).parent.parent
PACKAGES = [
    (_protogen.PACKAGE_DIR, ROOT / "tide" / "v1"),
    (_protogen.ROCKETMQ_DIR, ROOT / "tide" / "rocketmq_v2"),
]


@pytest.mark.parametrize(("proto_dir", "package"), PACKAGES, ids=[p for p, _ in PACKAGES])
def test_generated_code_is_up_to_date(proto_dir: str, package: Path, tmp_path: Path) -> None:
    written = _protogen.generate(tmp_path, proto_dir)
    assert written, f"no .proto files found under protos/{proto_dir}"
    stale = [
        path.name
        for path in written
        if not (package / path.name).exists()
        or (package / path.name).read_bytes() != path.read_bytes()
    ]
    assert not stale, f"generated code is out of date for {stale}: run `make protos`"


@pytest.mark.parametrize(("proto_dir", "package"), PACKAGES, ids=[p for p, _ in PACKAGES])
def test_every_generated_module_has_a_proto(proto_dir: str, package: Path) -> None:
    protos = {p.stem for p in _protogen.proto_files(proto_dir)}
    generated = {p.name.split("_pb2")[0] for p in package.glob("*_pb2*.py")}
    assert generated == protos, f"stale generated modules without a .proto: {generated - protos}"


def test_no_top_level_apache_package_is_imported() -> None:
    """The RocketMQ modules import each other from tide.rocketmq_v2: the official client's
    own ``apache``/``rocketmq`` packages never come in through ours."""
    for path in (ROOT / "tide" / "rocketmq_v2").glob("*_pb2*.py*"):
        text = path.read_text(encoding="utf-8")
        assert "from apache" not in text and "import apache" not in text, path.name
