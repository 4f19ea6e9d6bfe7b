"""Checked-in generated code must be exactly what grpc_tools.protoc makes of the .proto files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto" / "suffixd" / "v1"
PROTOS = sorted(PROTO_DIR.glob("*.proto"))


@pytest.mark.parametrize("proto", PROTOS, ids=[p.name for p in PROTOS])
def test_generated_code_matches_proto(proto: Path, tmp_path: Path) -> None:
    src = tmp_path / "proto" / "suffixd" / "v1"
    src.mkdir(parents=True)
    for p in PROTOS:  # protos may import each other
        shutil.copy(p, src / p.name)
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path / 'proto'}",
         f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}",
         str(src / proto.name)],
        check=True,
    )
    stem = proto.stem
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
        generated = (out / "suffixd" / "v1" / f"{stem}{suffix}").read_text()
        checked_in = PROTO_DIR / f"{stem}{suffix}"
        assert checked_in.exists(), f"{checked_in.name} is missing: regenerate it"
        assert checked_in.read_text() == generated, (
            f"{checked_in.name} is stale; regenerate with: python -m grpc_tools.protoc -Iproto "
            "--python_out=proto --pyi_out=proto --grpc_python_out=proto "
            f"proto/suffixd/v1/{proto.name}"
        )


def test_protos_found() -> None:
    assert any(p.name == "suffixd.proto" for p in PROTOS)
