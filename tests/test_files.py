"""fusionlab.files: a reader never sees half a file, and a write keeps the mode open() would give."""

import os
import stat

import pytest

from fusionlab.files import atomic_write, replacing


def test_a_block_that_fails_leaves_the_target_as_it_was_and_no_temporary_file(tmp_path):
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="half-way"):
        with replacing(target) as tmp:
            tmp.write_bytes(b"new, half")
            raise RuntimeError("half-way")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_a_block_that_succeeds_replaces_the_target_in_one_rename_and_keeps_its_mode(tmp_path):
    target = tmp_path / "sub" / "out.bin"
    atomic_write(target, b"first")
    os.chmod(target, 0o640)
    with replacing(target) as tmp:
        assert tmp.parent == target.parent and not target.read_bytes() == b""
        tmp.write_bytes(b"second")
        assert target.read_bytes() == b"first"  # not replaced before the block ends
    assert target.read_bytes() == b"second"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]
