"""Checkpoints that share files (hard links from a LinkingWriter): verification, fallback, quarantine and rotation
never lose a file a surviving checkpoint lists, and a shared file corrupted in place fails every checkpoint linking
it."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from tdrl.ckpt import CheckpointCorrupt, Checkpointer, CheckpointWarning, LinkingWriter, verify_checkpoint
from tdrl.replay import TransitionReplayBuffer
from tests.replay.helpers import make_stream


def _buffer(directory: Path) -> TransitionReplayBuffer:
    rb = TransitionReplayBuffer(directory, 2 * 300, n_step=2, seed=3)
    rb.ring.segment_bytes = 2 * 20 * 24  # 20 steps of the widest group per segment
    return rb


def _saves(rb, ckpt: Checkpointer, steps: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """Extend by each number of steps and checkpoint; the store's contents at every checkpoint."""
    stores = {}
    for i, n in enumerate(steps):
        rb.extend(make_stream(2, n, seed=i))
        ckpt.save({"i": i}, i, extra_writers={"replay": rb.checkpoint_writer()})
        stores[i] = {name: field.clone() for name, field in rb.ring.store.fields.items()}
    return stores


def _files(checkpoint: Path) -> dict[str, tuple[int, int]]:
    """Relative file name -> (inode, size) of a checkpoint's replay segments."""
    return {f.name: (f.stat().st_ino, f.stat().st_size) for f in (checkpoint / "replay" / "segments").glob("*.bin")}


def _shared(a: Path, b: Path) -> list[str]:
    fa, fb = _files(a), _files(b)
    return sorted(name for name in fa.keys() & fb.keys() if fa[name][0] == fb[name][0])


def _flip_in_place(file: Path) -> None:
    """One bit flipped through this name, same inode (every checkpoint linking it sees it)."""
    with open(file, "r+b") as f:
        f.seek(3)
        byte = f.read(1)
        f.seek(3)
        f.write(bytes([byte[0] ^ 1]))


def _loaded_store(directory: Path, ckpt: Checkpointer) -> tuple[dict, int]:
    rb = _buffer(directory)
    state, info = ckpt.load_latest(extra_readers={"replay": rb.loads})
    return {name: field.clone() for name, field in rb.ring.store.fields.items()}, info.iteration


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_corrupt_shared_segment_fails_every_checkpoint_that_links_it(tmp_path):
    rb = _buffer(tmp_path / "rb")
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="all")
    stores = _saves(rb, ckpt, [100, 50, 50])  # 0: steps 0-99; 1: 100-149; 2: 150-199
    c0, c1, c2 = (info.path for info in ckpt.list())
    written_at_1 = sorted(set(_shared(c1, c2)) - set(_shared(c0, c1)))  # new in 1, linked by 2
    assert written_at_1 and _shared(c0, c1) and _shared(c0, c2)
    _flip_in_place(c2 / "replay" / "segments" / written_at_1[0])
    for bad in (c1, c2):
        with pytest.raises(CheckpointCorrupt, match=written_at_1[0]):
            verify_checkpoint(bad)
    verify_checkpoint(c0)
    with pytest.warns(CheckpointWarning) as record:
        store, iteration = _loaded_store(tmp_path / "rb2", ckpt)
    assert iteration == 0 and len(record) == 2  # both checkpoints linking it were skipped and moved aside
    _assert_same(stores[0], store)
    verify_checkpoint(c0)  # quarantining the two took nothing it links
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "ck" / "corrupt").iterdir()) == [c1.name, c2.name]


def test_corrupt_newest_only_segment_falls_back_to_the_one_before_intact(tmp_path):
    rb = _buffer(tmp_path / "rb")
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="last")
    stores = _saves(rb, ckpt, [100, 60, 60, 60])
    older, newest = (info.path for info in ckpt.list())
    own = sorted(set(_files(newest)) - set(_shared(older, newest)))
    _flip_in_place(newest / "replay" / "segments" / own[-1])
    with pytest.warns(CheckpointWarning, match=own[-1]):
        store, iteration = _loaded_store(tmp_path / "rb2", ckpt)
    assert iteration == 2
    _assert_same(stores[2], store)
    # training goes on from there: the next checkpoint links from the loaded one, never from the quarantined one
    resumed = _buffer(tmp_path / "rb3")
    ckpt.load_latest(extra_readers={"replay": resumed.loads})
    assert ckpt.link_source() == older
    resumed.extend(make_stream(2, 10, seed=50))
    path = ckpt.save({"i": 3}, 3, extra_writers={"replay": resumed.checkpoint_writer()})
    assert _shared(older, path)
    verify_checkpoint(path)
    verify_checkpoint(older)


def test_rotation_never_breaks_a_surviving_checkpoint(tmp_path):
    rb = _buffer(tmp_path / "rb")
    for mode in ("last", "gap_and_last"):
        ckpt = Checkpointer(tmp_path / mode, snapshot_mode=mode, snapshot_gap=3)
        for i in range(12):  # 12 x 70 steps: wraps the 300-step ring, rewriting every segment
            rb.extend(make_stream(2, 70, seed=i))
            ckpt.save({"i": i}, i, extra_writers={"replay": rb.checkpoint_writer()})
            for info in ckpt.list():
                verify_checkpoint(info.path)
        kept = [info.iteration for info in ckpt.list()]
        assert kept == ([10, 11] if mode == "last" else [0, 3, 6, 9, 10, 11])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store, iteration = _loaded_store(tmp_path / "rb2", ckpt)
    assert iteration == 11
    _assert_same({name: field.clone() for name, field in rb.ring.store.fields.items()}, store)


def test_a_linked_file_changed_after_publishing_is_not_trusted(tmp_path):
    """A file of the previous checkpoint rewritten in place (its mtime changes) is not linked again under the sha256
    it was published with: the component is written again without links, and the new checkpoint is sound."""
    rb = _buffer(tmp_path / "rb")
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="all")
    _saves(rb, ckpt, [100])
    first = ckpt.list()[0].path
    victim = sorted((first / "replay" / "segments").glob("root.*.bin"))[0]
    published = victim.stat().st_mtime_ns
    _flip_in_place(victim)
    if victim.stat().st_mtime_ns == published:  # file times tick every few ms: the flip came later than that
        os.utime(victim, ns=(published, published + 10_000_000))
    rb.extend(make_stream(2, 20, seed=9))
    with pytest.warns(CheckpointWarning, match=f"{victim.name} changed after"):
        second = ckpt.save({"i": 1}, 1, extra_writers={"replay": rb.checkpoint_writer()})
    assert _shared(first, second) == []
    verify_checkpoint(second)
    store, iteration = _loaded_store(tmp_path / "rb2", ckpt)
    assert iteration == 1
    _assert_same({name: field.clone() for name, field in rb.ring.store.fields.items()}, store)


def test_linking_writer_contract(tmp_path):
    """The Checkpointer hands a LinkingWriter the component's folder in the newest checkpoint (None at first), and
    a linked file's sha256 is carried from its manifest."""
    seen = []

    def write(directory: Path, previous: Path | None) -> None:
        seen.append(previous)
        if previous is not None:
            os.link(previous / "kept.bin", directory / "kept.bin")
        else:
            (directory / "kept.bin").write_bytes(b"k" * 100)
        (directory / "new.bin").write_bytes(os.urandom(10))

    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="last")
    first = ckpt.save({}, 0, extra_writers={"blob": LinkingWriter(write)})
    second = ckpt.save({}, 1, extra_writers={"blob": LinkingWriter(write)})
    assert seen == [None, first / "blob"]
    manifests = [json.loads((p / "MANIFEST.json").read_text())["files"] for p in (first, second)]
    assert manifests[0]["blob/kept.bin"] == manifests[1]["blob/kept.bin"]
    assert (second / "blob" / "kept.bin").stat().st_nlink == 2
    ckpt.save({}, 2, extra_writers={"blob": LinkingWriter(write)})
    assert (tmp_path / "ck" / "itr_00000002" / "blob" / "kept.bin").stat().st_nlink == 2  # itr 0 rotated away


def test_links_into_a_checkpoint_whose_manifest_has_no_mtimes_are_hashed(tmp_path, monkeypatch):
    """Manifests written before files were shared record no mtimes: a file linked from one is read and compared."""
    import tdrl.ckpt.files

    def write(directory: Path, previous: Path | None) -> None:
        if previous is not None:
            os.link(previous / "kept.bin", directory / "kept.bin")
        else:
            (directory / "kept.bin").write_bytes(b"k" * 100)

    def strip_mtimes(checkpoint: Path) -> None:
        manifest = json.loads((checkpoint / "MANIFEST.json").read_text())
        for entry in manifest["files"].values():
            del entry["mtime_ns"]
        (checkpoint / "MANIFEST.json").write_text(json.dumps(manifest))

    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="all")
    strip_mtimes(ckpt.save({}, 0, extra_writers={"blob": LinkingWriter(write)}))
    hashed = []
    real = tdrl.ckpt.files._hash_file
    monkeypatch.setattr(tdrl.ckpt.files, "_hash_file", lambda p, **kw: hashed.append(p.name) or real(p, **kw))
    second = ckpt.save({}, 1, extra_writers={"blob": LinkingWriter(write)})
    assert "kept.bin" in hashed and (second / "blob" / "kept.bin").stat().st_nlink == 2
    strip_mtimes(second)
    with open(second / "blob" / "kept.bin", "r+b") as f:  # the same size, other content
        f.write(b"x")
    with pytest.warns(CheckpointWarning, match="kept.bin changed after"):
        third = ckpt.save({}, 2, extra_writers={"blob": LinkingWriter(write)})
    verify_checkpoint(third)
    assert (third / "blob" / "kept.bin").read_bytes() == b"k" * 100  # written again, not linked
