"""orchestrator.tooling.files: atomic writes leave no temporary files and keep identical files alone."""

from __future__ import annotations

import hashlib
import os

import pytest

from orchestrator.tooling.files import copy_atomic, sha256_file, write_atomic


def test_sha256_file_matches_hashlib_across_blocks(tmp_path):
    data = os.urandom((1 << 20) + 123)  # more than one 1 MiB block
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_write_atomic_sets_mode_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "tool"
    write_atomic(target, b"one", 0o755)
    write_atomic(target, b"two", 0o644)
    assert target.read_bytes() == b"two" and target.stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == ["tool"]


def test_write_atomic_if_changed_keeps_the_same_file(tmp_path):
    target = tmp_path / "stub"
    write_atomic(target, b"abc", 0o644)
    inode = target.stat().st_ino
    write_atomic(target, b"abc", 0o755, if_changed=True)  # same bytes: same file, new mode
    assert target.stat().st_ino == inode and target.stat().st_mode & 0o777 == 0o755
    write_atomic(target, b"abd", 0o755, if_changed=True)
    assert target.stat().st_ino != inode and target.read_bytes() == b"abd"


def test_copy_atomic_and_a_failed_write_leaves_the_target(tmp_path):
    (tmp_path / "src").write_bytes(b"payload")
    copy_atomic(tmp_path / "src", tmp_path / "dst", 0o700)
    assert (tmp_path / "dst").read_bytes() == b"payload" and (tmp_path / "dst").stat().st_mode & 0o777 == 0o700
    with pytest.raises(OSError):
        copy_atomic(tmp_path / "missing", tmp_path / "dst")
    assert (tmp_path / "dst").read_bytes() == b"payload"
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]
