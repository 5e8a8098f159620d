"""The compilation cache is code: only a directory nobody else can write to is used,
and only entries authenticated by its key are ever deserialized."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from conftest import hold_executables

from torch_tpu import cache, cache_trust, metrics

_PROGRAM = textwrap.dedent(
    """
    import json, warnings, torch, torch_tpu
    from torch_tpu import cache, metrics
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.arange(64, dtype=torch.float32, device="tpu").reshape(8, 8)
        value = (torch.sin(x) @ x.t() - 3).sum().item()
    ours = [str(w.message) for w in caught if "torch_tpu" in str(w.message)]
    print(json.dumps({"value": value, "compiles": metrics.snapshot().get("compiles", 0),
                      "stats": cache.stats(), "warnings": ours}))
    """
)


def _run(directory, **env) -> dict:
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(directory), **env)
    env.pop("TORCH_TPU_PERSISTENT_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


class _Sentinel:
    """Unpickling this creates a file: proof that a planted payload was deserialized."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_planted_entries_are_never_deserialized(tmp_path):
    root = tmp_path / "cache"
    first = _run(root)
    entries = sorted(root.glob("*/*.xc"))
    assert first["compiles"] == len(entries) > 0
    sentinel = tmp_path / "planted-code-ran"
    payload = pickle.dumps(_Sentinel(str(sentinel)))
    for entry in entries:  # a well-formed entry of the old format: length and correct SHA-256
        import hashlib

        header = cache._HEADER.pack(len(payload), hashlib.sha256(payload).digest())
        entry.write_bytes(cache._MAGIC + header + payload)
    second = _run(root)
    assert not sentinel.exists(), "a planted cache entry was unpickled"
    assert second["value"] == first["value"]
    assert second["stats"]["rejected_entries"] == len(entries)
    assert second["compiles"] == len(entries)  # recompiled ...
    third = _run(root)
    assert third["compiles"] == 0 and third["stats"]["disk_hits"] == len(entries)  # ... replaced
    rejected = [w for w in second["warnings"] if "not authenticated" in w]
    assert len(rejected) == 1, second["warnings"]  # one warning, not one per entry


def test_entries_from_another_key_are_rejected(tmp_path):
    root = tmp_path / "cache"
    first = _run(root)
    (root / cache_trust.KEY_NAME).unlink()  # as if the entries were copied from another user
    second = _run(root)
    assert second["stats"]["rejected_entries"] == first["compiles"]
    assert second["value"] == first["value"]


def test_fresh_directory_and_files_are_private(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "umask", os.umask)  # restore whatever the test changes
    old = os.umask(0o022)
    try:
        root = tmp_path / "a" / "b"
        out = _run(root)
    finally:
        os.umask(old)
    assert out["stats"]["problem"] is None and out["stats"]["disk_writes"] > 0
    for directory in (tmp_path / "a", root, *[p for p in root.iterdir() if p.is_dir()]):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.name == cache_trust.KEY_NAME for p in files)
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def _assert_refused(root, match):
    out = _run(root)
    assert out["stats"]["problem"] and match in out["stats"]["problem"]
    assert out["stats"]["disk_writes"] == 0 and out["compiles"] > 0
    assert not list(root.glob("*/*.xc"))
    assert len([w for w in out["warnings"] if match in w]) == 1
    info = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "cache", "info"],
        env=dict(os.environ, TORCH_TPU_CACHE_DIR=str(root)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert info.returncode == 1 and match in info.stdout


def test_group_writable_directory_is_refused(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o770)
    _assert_refused(root, "writable by group or others")


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory another user owns needs root")
def test_foreign_owned_directory_is_refused(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)  # nobody
    _assert_refused(root, "not to you")


def test_file_in_place_of_directory_warns_once_and_runs(tmp_path):
    root = tmp_path / "cache"
    root.write_text("not a directory")
    _assert_refused(root, "not a directory")


def test_full_disk_warns_once_and_runs(tmp_path, monkeypatch):
    """A write that fails (no space left) is reported once; results are unaffected."""
    import errno
    import tempfile

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    saved = cache.directory()
    try:
        cache.set_directory(tmp_path / "cache")
        cache.clear(disk=False)
        hold_executables(monkeypatch)  # (no memory reset's warning among those counted)
        monkeypatch.setattr(tempfile, "mkstemp", no_space)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.ones(5, 5, device="tpu")
            values = [(x * n + n).sum().item() for n in range(1, 6)]
        assert values == [50.0 * n for n in range(1, 6)]
        messages = [str(w.message) for w in caught if "torch_tpu" in str(w.message)]
        assert len(messages) == 1 and "No space left" in messages[0]
        assert cache.stats()["write_errors"] > 1
    finally:
        cache.set_directory(saved)


def test_deliberately_shared_cache(tmp_path):
    """A group-writable directory is used when the users share a key on purpose."""
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o770)
    key = tmp_path / "fleet.key"
    key.write_bytes(os.urandom(32))
    os.chmod(key, 0o640)
    first = _run(root, TORCH_TPU_CACHE_KEY_FILE=str(key))
    assert first["stats"]["problem"] is None and first["stats"]["disk_writes"] > 0
    second = _run(root, TORCH_TPU_CACHE_KEY_FILE=str(key))
    assert second["compiles"] == 0
    os.chmod(key, 0o644)  # a key everyone can read authenticates nothing
    out = _run(root, TORCH_TPU_CACHE_KEY_FILE=str(key))
    assert "readable by everyone" in out["stats"]["problem"]


def test_one_warning_per_process_not_per_op(tmp_path, monkeypatch):
    hold_executables(monkeypatch)  # (no memory reset's warning among those counted)
    saved = cache.directory()
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    try:
        cache.set_directory(blocker)
        metrics.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = torch.randn(7, 3, device="tpu")
            (a @ a.t()).relu().sum().cpu()
        assert metrics.snapshot()["compiles"] > 2
        assert len([w for w in caught if "torch_tpu" in str(w.message)]) == 1
        assert "not a directory" in cache.problem()
    finally:
        cache.set_directory(saved)
