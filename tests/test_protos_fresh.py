"""The generated code under tide/v1 must match what protos/ generates now."""

from __future__ import annotations

from pathlib import Path

from tide import _protogen

PACKAGE = Path(_protogen.__file__).parent / "v1"


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    written = _protogen.generate(tmp_path)
    assert written, "no .proto files found under protos/tide/v1"
    stale = [
        path.name
        for path in written
        if not (PACKAGE / path.name).exists()
        or (PACKAGE / path.name).read_bytes() != path.read_bytes()
    ]
    assert not stale, f"generated code is out of date for {stale}: run `make protos`"


def test_every_generated_module_has_a_proto() -> None:
    protos = {p.stem for p in _protogen.proto_files()}
    generated = {p.name.split("_pb2")[0] for p in PACKAGE.glob("*_pb2*.py")}
    assert generated == protos, f"stale generated modules without a .proto: {generated - protos}"
