"""Replay checkpoints hold the filled part of the data in time segments, link the unchanged ones from the previous
checkpoint, and restore the store bitwise (after wrap-around too), for all three buffer kinds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import tdrl.ckpt.files
from tdrl.ckpt import Checkpointer, verify_checkpoint
from tdrl.replay import FrameStack, PrioritizedSampler, SequenceReplayBuffer, TransitionReplayBuffer
from tdrl.replay.segments import field_cursors, segment_plan
from tdrl.utils.files import disk_bytes
from tests.replay.helpers import atari_episodes, make_stream

STATE = ("recurrent_state", "h")


def _transitions(directory: Path, capacity: int = 2 * 400) -> TransitionReplayBuffer:
    sampler = PrioritizedSampler(alpha=0.6, beta_steps=500, seed=1)
    rb = TransitionReplayBuffer(directory, capacity, sampler=sampler, n_step=3, gamma=0.9, seed=11)
    rb.ring.segment_bytes = 1600  # 2 streams x 40 steps of the 20-byte float32 group: many segments
    return rb


def _segments(checkpoint: Path) -> dict[str, os.stat_result]:
    return {f.name: f.stat() for f in sorted((checkpoint / "replay" / "segments").glob("*.bin"))}


def _index(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "replay" / "segments" / "index.json").read_text())


def _versions(checkpoint: Path) -> dict[str, tuple]:
    """Segment file name -> (entries, versions) from a checkpoint's index."""
    return {f"{name}.{k:05d}.bin": (n, versions) for name, spec in _index(checkpoint)["fields"].items()
            for k, n, versions in spec["segments"]}


def _store_copy(rb) -> dict[str, torch.Tensor]:
    return {name: field.clone() for name, field in rb.ring.store.fields.items()}


def _assert_same_store(expected: dict[str, torch.Tensor], rb) -> None:
    assert set(expected) == set(rb.ring.store.fields)
    for name, field in rb.ring.store.fields.items():
        assert torch.equal(field, expected[name]), f"field {name} differs"


def test_segment_plan_versions_and_fill():
    # a 10-entry axis in segments of 4: [0, 4), [4, 8), [8, 10)
    assert segment_plan(10, np.array([0]), 4) == []
    assert segment_plan(10, np.array([6]), 4) == [(0, 4, [3]), (1, 2, [5])]
    assert segment_plan(10, np.array([13]), 4) == [(0, 4, [12]), (1, 4, [7]), (2, 2, [9])]  # wrapped once
    assert segment_plan(10, np.array([6, 2]), 4) == [(0, 4, [3, 1]), (1, 2, [5, -1])]  # per-stream cursors
    assert segment_plan(10, None, 4) == [(0, 10, None)]


def test_second_checkpoint_links_unchanged_segments_and_hashes_only_new_ones(tmp_path, monkeypatch):
    rb = _transitions(tmp_path / "rb")
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="all")
    rb.extend(make_stream(2, 150, seed=0))
    first = ckpt.save({}, 0, extra_writers={"replay": rb.checkpoint_writer()})
    assert sum(s.st_size for s in _segments(first).values()) == sum(
        field[:, :150].numel() * field.element_size() for field in rb.ring.store.fields.values())  # filled part
    rb.extend(make_stream(2, 30, seed=1))
    hashed = []
    real = tdrl.ckpt.files._hash_file
    monkeypatch.setattr(tdrl.ckpt.files, "_hash_file", lambda p, **kw: hashed.append(p.name) or real(p, **kw))
    second = ckpt.save({}, 1, extra_writers={"replay": rb.checkpoint_writer()})
    before, after = _segments(first), _segments(second)
    old_versions, new_versions = _versions(first), _versions(second)
    linked = {name for name, st in after.items() if name in before and before[name].st_ino == st.st_ino}
    unchanged = {name for name in after if old_versions.get(name) == new_versions[name]}
    assert linked == unchanged and len(linked) >= 6, (linked, unchanged)
    written = set(after) - linked
    # new data: steps 150..179 of every segmented field, i.e. the segments around them
    for name in written:
        k, n = int(name.rsplit(".", 2)[1]), new_versions[name][0]
        assert new_versions[name][1][0] >= 150, f"{name} was written again though nothing changed in it"
        assert after[name].st_nlink == 1 and n > 0 and k >= 0
    assert sorted(hashed) == sorted([*written, "state.pt", "replay_state.pt", "index.json"])
    verify_checkpoint(first)
    verify_checkpoint(second)


def test_keeping_two_checkpoints_costs_about_one_replay(tmp_path):
    rb = _transitions(tmp_path / "rb", capacity=2 * 5000)
    rb.ring.segment_bytes = 64_000  # about 120 steps of the 532-byte rows
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="last")
    for i in range(8):
        rb.extend(make_stream(2, 500, seed=i, obs_dim=64))
        ckpt.save({}, i, extra_writers={"replay": rb.checkpoint_writer()})
    assert len(ckpt.list()) == 2
    data = sum(field[:, :4000].numel() * field.element_size() for field in rb.ring.store.fields.values())
    trees = sum((c.path / "replay" / "replay_state.pt").stat().st_size for c in ckpt.list())  # the sampler's
    kept = disk_bytes(tmp_path / "ck") - trees
    assert data < kept < 1.15 * data, (kept, data)


def _fill_and_checkpoint(rb, batches, ckpt: Checkpointer) -> dict[int, dict[str, torch.Tensor]]:
    """Extend with each batch, checkpoint after each, and return the store's contents at every checkpoint."""
    stores = {}
    for i, batch in enumerate(batches):
        rb.extend(batch)
        n = min(8, rb.ready_count())
        if rb.sampler is not None and n:
            s = rb.sample(n)
            rb.update_priority(s["index"], torch.rand(n, generator=torch.Generator().manual_seed(i)) * 5)
        ckpt.save({}, i, extra_writers={"replay": rb.checkpoint_writer()})
        stores[i] = _store_copy(rb)
    return stores


def test_resume_after_wraparound_is_bitwise_and_keeps_linking(tmp_path):
    rb = _transitions(tmp_path / "rb")
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="last")
    stores = _fill_and_checkpoint(rb, [make_stream(2, 90, seed=i) for i in range(11)], ckpt)  # 990 steps > 400
    assert rb.ring.write_done > 2 * rb.ring.time_capacity
    newest = ckpt.list()[-1].path
    assert all(v[1][0] >= 990 - 400 for v in _versions(newest).values() if v[1] is not None)  # all rewritten
    expected = [rb.sample(16) for _ in range(4)]
    resumed = _transitions(tmp_path / "rb2")
    ckpt.load_latest(extra_readers={"replay": resumed.loads})
    _assert_same_store(stores[10], resumed)
    assert all((got == want).all() for got, want in zip([resumed.sample(16) for _ in range(4)], expected,
                                                           strict=True))
    # both go on identically; the first checkpoint after the resume links what is unchanged since the loaded one
    batch = make_stream(2, 20, seed=99)
    rb.extend(batch)
    resumed.extend(batch)
    after = Checkpointer(tmp_path / "ck", snapshot_mode="last").save({}, 11, extra_writers={
        "replay": resumed.checkpoint_writer()})
    linked = [n for n, st in _segments(after).items() if st.st_nlink > 1]
    assert len(linked) >= len(_segments(after)) // 2
    fresh = _transitions(tmp_path / "rb3")
    Checkpointer(tmp_path / "ck").load_latest(extra_readers={"replay": fresh.loads})
    _assert_same_store(_store_copy(rb), fresh)


def test_a_lost_branch_is_never_linked(tmp_path):
    """Resumed from an older checkpoint, a run writes other data at the steps a lost run's newer checkpoint holds:
    linking from that checkpoint must take only what both share (segments older than the resume point)."""
    rb = _transitions(tmp_path / "rb")
    rb.extend(make_stream(2, 100, seed=0))
    rb.dumps(tmp_path / "old")
    rb.extend(make_stream(2, 60, seed=1))  # the lost run's steps 100..159
    rb.dumps(tmp_path / "lost", previous=tmp_path / "old")
    resumed = _transitions(tmp_path / "rb2")
    resumed.loads(tmp_path / "old")
    resumed.extend(make_stream(2, 60, seed=2))  # other data at the same steps
    resumed.dumps(tmp_path / "new", previous=tmp_path / "lost")
    check = _transitions(tmp_path / "rb3")
    check.loads(tmp_path / "new")
    _assert_same_store(_store_copy(resumed), check)
    # an unrelated buffer with the same cursors links nothing
    other = _transitions(tmp_path / "rb4")
    other.extend(make_stream(2, 160, seed=5))
    other.dumps(tmp_path / "other", previous=tmp_path / "lost")
    assert all(f.stat().st_nlink == 1 for f in (tmp_path / "other" / "segments").glob("*.bin"))


def test_frame_buffer_links_per_stream_frames_and_resumes_bitwise(tmp_path):
    def build(directory):
        rb = TransitionReplayBuffer(directory, 2 * 120, n_step=2, frame_stack=FrameStack(4, slack=0.25), seed=0)
        rb.ring.segment_bytes = 2 * 10 * 84 * 84  # 10 frames per stream per pixel segment
        return rb

    rb = build(tmp_path / "rb")
    data = atari_episodes(2, 400, seed=3, padding="zero")
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="last")
    stores = _fill_and_checkpoint(rb, [data[:, i : i + 40] for i in range(0, 400, 40)], ckpt)  # wraps 3 times
    cursors = field_cursors(rb.ring.store)["frames.pixels"]
    assert cursors[0] != cursors[1], "streams should have written different frame counts (episode ends)"
    newest = ckpt.list()[-1].path
    linked = [n for n, st in _segments(newest).items() if st.st_nlink > 1]
    assert any(n.startswith("frames.pixels") for n in linked)
    written = sum(st.st_size for n, st in _segments(newest).items() if st.st_nlink == 1)
    added = 40 * 2 * (84 * 84 + 8 + 1) + 84 * 84 * int(np.asarray(data["next", "done"][:, 360:400]).sum())
    assert written < 2 * added  # the new frames plus partly filled boundary segments
    resumed = build(tmp_path / "rb2")
    ckpt.load_latest(extra_readers={"replay": resumed.loads})
    _assert_same_store(stores[9], resumed)
    assert (resumed.sample(32) == rb.sample(32)).all()


def test_sequence_buffer_links_and_resumes_bitwise(tmp_path):
    def build(directory):
        rb = SequenceReplayBuffer(directory, 3 * 96, warmup_T=4, batch_T=8, lookahead_T=2, rnn_state_interval=8,
                                  state_keys=[STATE], sampler=PrioritizedSampler(alpha=0.6, seed=0), seed=0)
        rb.ring.segment_bytes = 3 * 16 * 4  # 4 states per segment, 16 steps of the smallest field
        return rb

    def batch(t0, T):
        td = make_stream(3, T, seed=t0)
        td[STATE] = torch.randn(3, T, 2, 2, generator=torch.Generator().manual_seed(t0))
        td["next", STATE] = td[STATE] + 0.5
        return td

    rb = build(tmp_path / "rb")
    ckpt = Checkpointer(tmp_path / "ck", snapshot_mode="last")
    stores = _fill_and_checkpoint(rb, [batch(t0, 26) for t0 in range(0, 26 * 9, 26)], ckpt)  # 234 > 96: wraps
    newest = ckpt.list()[-1].path
    assert any(n.startswith("state.") and st.st_nlink > 1 for n, st in _segments(newest).items())
    resumed = build(tmp_path / "rb2")
    ckpt.load_latest(extra_readers={"replay": resumed.loads})
    _assert_same_store(stores[8], resumed)
    assert all((resumed.sample(4) == rb.sample(4)).all() for _ in range(3))


def test_dumps_of_whole_field_files_still_load(tmp_path):
    """Checkpoints written before segments hold ``storage/<field>.bin`` copies of the whole files."""
    rb = _transitions(tmp_path / "rb")
    rb.extend(make_stream(2, 90, seed=0))
    old = tmp_path / "old"
    (old / "storage").mkdir(parents=True)
    rb.ring.store.flush()
    for name in rb.ring.store.fields:
        shutil.copyfile(rb.ring.store.directory / f"{name}.bin", old / "storage" / f"{name}.bin")
    state = rb.state_dict()
    del state["ring"]["meta"]["cursors"]  # as saved then
    torch.save(state, old / "replay_state.pt")
    resumed = _transitions(tmp_path / "rb2")
    resumed.loads(old)
    _assert_same_store(_store_copy(rb), resumed)
    assert (resumed.sample(16) == rb.sample(16)).all()
    resumed.dumps(tmp_path / "new")  # and its next dump holds only the filled part again
    assert sum(f.stat().st_size for f in (tmp_path / "new" / "segments").glob("*.bin")) == sum(
        field[:, :90].numel() * field.element_size() for field in rb.ring.store.fields.values())


def test_dumping_again_into_the_same_path_replaces_it(tmp_path):
    rb = _transitions(tmp_path / "rb")
    rb.extend(make_stream(2, 90, seed=0))
    rb.dumps(tmp_path / "first")
    rb.dumps(tmp_path / "dump", previous=tmp_path / "first")
    rb.extend(make_stream(2, 30, seed=1))
    rb.dumps(tmp_path / "dump", previous=tmp_path / "first")
    with pytest.raises(ValueError, match="previous must be another dump"):
        rb.dumps(tmp_path / "dump", previous=tmp_path / "dump")
    for path in ("first", "dump"):
        resumed = _transitions(tmp_path / f"rb-{path}")
        resumed.loads(tmp_path / path)
        assert resumed.write_count == (180 if path == "first" else 240)
    _assert_same_store(_store_copy(rb), resumed)


@pytest.mark.parametrize("damage", ["truncate", "missing"])
def test_a_damaged_segment_is_an_error_not_zeros(tmp_path, damage):
    rb = _transitions(tmp_path / "rb")
    rb.extend(make_stream(2, 90, seed=0))
    rb.dumps(tmp_path / "dump")
    victim = sorted((tmp_path / "dump" / "segments").glob("root.*.bin"))[0]
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-4])
    else:
        victim.unlink()
    with pytest.raises((OSError, ValueError), match=victim.name):
        _transitions(tmp_path / "rb2").loads(tmp_path / "dump")
