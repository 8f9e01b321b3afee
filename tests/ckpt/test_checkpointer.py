"""Checkpointer: round trip, snapshot modes, rotation, corruption detection and fallback, full disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, ReplayBuffer

from tdrl.ckpt import CheckpointCorrupt, Checkpointer, CheckpointError, CheckpointWarning, verify_checkpoint
from tdrl.ckpt.files import MANIFEST


def _state(i: int) -> dict:
    return {"iteration": i, "w": torch.full((64,), float(i)), "nested": {"adam": {"step": i}}}


def _iterations(ckpt: Checkpointer) -> list[int]:
    return [c.iteration for c in ckpt.list()]


def test_roundtrip_with_extra_component(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="all")

    def write_blob(d: Path) -> None:
        (d / "blob.bin").write_bytes(b"x" * 1000)
        (d / "sub").mkdir()
        (d / "sub" / "meta.json").write_text("{}")

    path = ckpt.save(_state(3), 3, extra_writers={"blob": write_blob})
    assert path == tmp_path / "ck" / "itr_00000003"
    manifest = verify_checkpoint(path)
    assert set(manifest["files"]) == {"state.pt", "blob/blob.bin", "blob/sub/meta.json"}
    assert manifest["files"]["blob/blob.bin"]["size"] == 1000
    seen = []
    state, info = ckpt.load_latest(
        extra_readers={"blob": lambda d: seen.append((d / "blob.bin").read_bytes())}
    )
    assert info.iteration == 3 and state["nested"]["adam"]["step"] == 3
    assert torch.equal(state["w"], torch.full((64,), 3.0))
    assert seen == [b"x" * 1000]
    with pytest.raises(CheckpointError, match="no component 'replay'"):
        ckpt.load_latest(extra_readers={"replay": lambda d: None})


def test_replay_buffer_through_extra_writers_samples_identically(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path / "s1"), batch_size=8)
    rb.extend(TensorDict({"obs": torch.randn(40, 3), "a": torch.arange(40)}, [40]))
    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save({"x": 1}, 0, extra_writers={"replay": rb.dumps})
    torch.manual_seed(5)
    expected = [rb.sample()["a"] for _ in range(5)]
    rb2 = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path / "s2"), batch_size=8)
    ckpt.load_latest(extra_readers={"replay": rb2.loads})
    torch.manual_seed(5)
    assert len(rb2) == 40
    assert all(torch.equal(e, rb2.sample()["a"]) for e in expected)


@pytest.mark.parametrize(
    ("mode", "kept", "written"),
    [
        ("none", [], []),
        ("last", [11, 12], list(range(13))),  # the one before the newest survives a bad newest
        ("all", list(range(13)), list(range(13))),
        ("gap", [0, 5, 10], [0, 5, 10]),
        ("gap_and_last", [0, 5, 10, 11, 12], list(range(13))),
    ],
)
def test_snapshot_modes(tmp_path, mode, kept, written):
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode=mode, snapshot_gap=5)
    saved = [i for i in range(13) if ckpt.save(_state(i), i) is not None]
    assert saved == written
    assert _iterations(ckpt) == kept
    assert not [
        p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".")
    ]  # no temp leftovers


def test_bad_mode_and_gap_are_errors(tmp_path):
    with pytest.raises(ValueError, match="snapshot_mode='sometimes'"):
        Checkpointer(tmp_path, snapshot_mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="snapshot_gap"):
        Checkpointer(tmp_path, snapshot_mode="gap", snapshot_gap=0)


def _corrupt_truncate(path: Path) -> str:
    f = path / "state.pt"
    f.write_bytes(f.read_bytes()[:100])
    return "state.pt has 100 bytes"


def _corrupt_flip(path: Path) -> str:
    f = path / "state.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size
    f.write_bytes(bytes(data))
    return "state.pt sha256"


def _corrupt_manifest(path: Path) -> str:
    (path / MANIFEST).unlink()
    return "manifest MANIFEST.json is missing"


def _corrupt_replay_file(path: Path) -> str:
    f = path / "extra" / "data.bin"
    # a truncated memmap would load as zeros without the manifest
    f.write_bytes(f.read_bytes()[:-8])
    return "extra/data.bin has"


@pytest.mark.parametrize(
    "corrupt", [_corrupt_truncate, _corrupt_flip, _corrupt_manifest, _corrupt_replay_file]
)
def test_corrupt_latest_falls_back_with_warning(tmp_path, corrupt):
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="all")
    for i in range(3):
        ckpt.save(
            _state(i),
            i,
            extra_writers={"extra": lambda d: (d / "data.bin").write_bytes(os.urandom(4096))},
        )
    expected_text = corrupt(tmp_path / "ck" / "itr_00000002")
    with pytest.warns(CheckpointWarning, match="CORRUPT") as record:
        state, info = ckpt.load_latest()
    assert info.iteration == 1 and state["iteration"] == 1
    message = str(record[0].message)
    assert "itr_00000002" in message and expected_text in message
    assert _iterations(ckpt) == [0, 1]  # moved aside, kept for inspection, never loaded again
    assert [p.name.split("-")[0] for p in (tmp_path / "ck" / "corrupt").iterdir()] == [
        "itr_00000002"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ckpt.load_latest()[1].iteration == 1  # no second warning


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_flip, _corrupt_manifest])
def test_corrupt_latest_is_an_error_when_strict(tmp_path, corrupt):
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="all", strict=True)
    ckpt.save(_state(0), 0)
    ckpt.save(_state(1), 1)
    expected_text = corrupt(tmp_path / "ck" / "itr_00000001")
    with pytest.raises(CheckpointCorrupt, match="itr_00000001") as err:
        ckpt.load_latest()
    assert expected_text in str(err.value) and "strict" in str(err.value)
    assert _iterations(ckpt) == [0, 1]  # nothing moved or deleted


def test_all_corrupt_returns_none(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save(_state(0), 0)
    _corrupt_flip(tmp_path / "ck" / "itr_00000000")
    with pytest.warns(CheckpointWarning):
        assert ckpt.load_latest() is None


@pytest.mark.parametrize("mode", ["last", "gap_and_last"])
def test_default_rotation_keeps_the_one_before_a_corrupt_newest(tmp_path, mode):
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode=mode, snapshot_gap=5)
    for i in range(4):
        ckpt.save(_state(i), i)
    assert _iterations(ckpt)[-2:] == [2, 3]
    _corrupt_flip(tmp_path / "ck" / "itr_00000003")
    with pytest.warns(CheckpointWarning, match="itr_00000003"):
        state, info = ckpt.load_latest()
    assert info.iteration == 2 and state["iteration"] == 2
    ckpt.save(_state(3), 3)  # training goes on from there
    assert _iterations(ckpt)[-2:] == [2, 3]


def test_verification_is_remembered_until_a_file_changes(tmp_path, monkeypatch):
    import tdrl.ckpt.files

    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save(_state(0), 0)
    ckpt.save(_state(1), 1)
    hashed = []
    real = tdrl.ckpt.files._hash_file
    monkeypatch.setattr(tdrl.ckpt.files, "_hash_file", lambda p, **kw: hashed.append(p.name) or real(p, **kw))
    newest, problems = ckpt.newest_valid()
    assert newest.iteration == 1 and problems == [] and hashed == ["state.pt"]
    assert ckpt.load_latest()[1].iteration == 1 and hashed == ["state.pt"]  # not hashed again
    _corrupt_flip(tmp_path / "ck" / "itr_00000001")  # rewritten after the check: checked again
    newest, problems = ckpt.newest_valid()
    assert newest.iteration == 0 and "itr_00000001: file state.pt sha256" in problems[0]
    assert _iterations(ckpt) == [0, 1]  # newest_valid only reads


def test_unpicklable_state_leaves_nothing_behind(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save(_state(0), 0)
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises
        ckpt.save({"f": lambda: 0}, 1)
    assert _iterations(ckpt) == [0]
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["itr_00000000"]


def test_stale_temp_dirs_are_ignored_and_removed(tmp_path):
    root = tmp_path / "ck"
    Checkpointer(root).save(_state(0), 0)
    stale = root / ".tmp-itr_00000001-999999999-abcd1234"  # a pid that cannot exist
    stale.mkdir()
    (stale / "state.pt").write_bytes(b"partial")
    ckpt = Checkpointer(root)
    assert stale.exists()  # building a Checkpointer changes nothing (a refused resume must not)
    assert ckpt.load_latest()[1].iteration == 0
    assert not stale.exists()


def test_resave_same_iteration_replaces_it(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="all")
    ckpt.save(_state(1), 4)
    ckpt.save(_state(2), 4)
    state, info = ckpt.load_latest()
    assert info.iteration == 4 and state["iteration"] == 2
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["itr_00000004"]


def _mount_tmpfs(path: Path, options: str) -> bool:
    if os.geteuid() != 0 or sys.platform != "linux":
        return False
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_disk_full_at_checkpoint_time_keeps_previous(tmp_path):
    """A real full filesystem (a 2 MiB tmpfs): clear error naming the cause, previous checkpoint intact."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "size=2m"):
        pytest.skip("needs root and tmpfs to build a small filesystem")
    try:
        ckpt = Checkpointer(mnt / "ck", snapshot_mode="last")
        ckpt.save({"w": torch.zeros(1000)}, 0)
        with pytest.raises(
            CheckpointError, match=r"No space left on device \(disk full\).*itr_00000000 is intact"
        ):
            ckpt.save({"w": torch.zeros(1_000_000)}, 1)  # 4 MB does not fit
        assert _iterations(ckpt) == [0]
        assert not [p for p in (mnt / "ck").iterdir() if p.name.startswith(".")]
        state, info = ckpt.load_latest()
        assert info.iteration == 0 and state["w"].shape == (1000,)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.timeout(60)
def test_file_size_limit_at_checkpoint_time_keeps_previous(tmp_path):
    """Works without root: RLIMIT_FSIZE makes the OS refuse the write (EFBIG) like a quota would."""
    script = textwrap.dedent(
        f"""
        import resource, signal, torch
        from tdrl.ckpt import Checkpointer, CheckpointError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        ckpt = Checkpointer({str(tmp_path / "ck")!r}, snapshot_mode="last")
        ckpt.save({{"w": torch.zeros(1000)}}, 0)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))
        try:
            ckpt.save({{"w": torch.zeros(1_000_000)}}, 1)
        except CheckpointError as e:
            print("ERROR:", e)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert "ERROR: could not write checkpoint" in out.stdout, out.stderr
    assert "File too large" in out.stdout and "itr_00000000 is intact" in out.stdout
    ckpt = Checkpointer(tmp_path / "ck")
    assert _iterations(ckpt) == [0]
    assert ckpt.load_latest()[0]["w"].shape == (1000,)


def test_manifest_records_versions_and_iteration(tmp_path):
    path = Checkpointer(tmp_path / "ck").save(_state(7), 7)
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["iteration"] == 7 and manifest["format"] == 1
    assert manifest["versions"]["torch"] == torch.__version__


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_load_onto_cpu_or_cuda(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save({"w": torch.arange(5.0, device="cuda")}, 0)
    state, _ = ckpt.load_latest(map_location="cpu")
    assert state["w"].device.type == "cpu" and state["w"].tolist() == [0, 1, 2, 3, 4]
    state, _ = ckpt.load_latest(map_location="cuda")
    assert state["w"].is_cuda
