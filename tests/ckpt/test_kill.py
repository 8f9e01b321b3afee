"""SIGKILL tests with real processes: exact resume, and checkpoint writes killed mid-write.

Kill points are random; the seed of each test's generator is in the assertion messages so a failure can be
replayed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from kill_checks import assert_same_progress, assert_same_tree, deterministic_progress, finish, kill_when, progress_rows

from tdrl.ckpt import Checkpointer, CheckpointWarning

SCRIPT = Path(__file__).with_name("resume_script.py")
ITERATIONS = 16


def _launch(run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            f"run.dir={run_dir}",
            f"iterations={ITERATIONS}",
            "sleep_s=0.03",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.timeout(240)
def test_sigkill_at_random_points_then_relaunch_is_bitwise_equal(tmp_path):
    reference = tmp_path / "reference"
    finish(_launch(reference))
    _, ref_rows = deterministic_progress(reference)
    assert [r[0] for r in ref_rows] == [str(i) for i in range(ITERATIONS)]
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    for trial in range(3):
        run_dir = tmp_path / f"trial{trial}"
        # row 2 is written after checkpoint 0 is published, so every trial resumes from a checkpoint
        kill_after_rows = rng.randint(2, ITERATIONS - 2)
        delay = rng.uniform(0.0, 0.04)
        note = f"trial {trial}, rng seed {seed}, killed after {kill_after_rows} rows + {delay:.3f}s"
        proc = _launch(run_dir)
        kill_when(proc, lambda d=run_dir, k=kill_after_rows: progress_rows(d / "progress.csv") >= k, delay, note,
                  timeout=60)
        assert not (run_dir / "final.pt").exists()
        out = finish(_launch(run_dir))
        assert "resuming run" in out, note
        assert_same_progress(reference, run_dir, note)
        assert_same_tree(torch.load(reference / "final.pt"), torch.load(run_dir / "final.pt"), note)
        log = (run_dir / "debug.log").read_text()  # appended across both launches
        assert log.count("run 'resume' in") == 2 and "resumed from itr_" in log, note


WRITER = textwrap.dedent(
    """
    import sys, torch
    from tdrl.ckpt import Checkpointer

    def replay_writer(i):
        def write(d):
            (d / "a.bin").write_bytes(bytes([i % 256]) * 3_000_000)
            (d / "b.bin").write_bytes(bytes([(i + 1) % 256]) * 1_000_000)
        return write

    ckpt = Checkpointer(sys.argv[1], snapshot_mode=sys.argv[2], snapshot_gap=3)
    i = 0
    while True:
        ckpt.save({"i": i, "w": torch.full((3_000_000,), float(i))}, i, extra_writers={"replay": replay_writer(i)})
        print(i, flush=True)
        i += 1
    """
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["last", "gap_and_last"])
def test_kill_during_checkpoint_writes_always_leaves_a_loadable_latest(tmp_path, mode):
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    for trial in range(4):
        root = tmp_path / f"trial{trial}"
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), mode], stdout=subprocess.PIPE, text=True
        )
        first = proc.stdout.readline()  # one checkpoint is published
        assert first.strip() == "0", f"writer failed: {first!r}"
        time.sleep(rng.uniform(0.0, 0.6))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        note = f"mode {mode}, trial {trial}, rng seed {seed}"
        seen: dict[str, bytes] = {}

        def read_replay(d: Path, seen: dict[str, bytes] = seen) -> None:
            seen.update({p.name: p.read_bytes() for p in d.iterdir()})

        with warnings.catch_warnings():
            # no published checkpoint may be corrupt: a warning here would mean a torn write was published
            warnings.simplefilter("error", CheckpointWarning)
            ckpt = Checkpointer(root, snapshot_mode=mode, snapshot_gap=3)
            loaded = ckpt.load_latest(extra_readers={"replay": read_replay})
        assert loaded is not None, note
        state, info = loaded
        i = state["i"]
        assert info.iteration == i, note
        assert torch.equal(state["w"], torch.full((3_000_000,), float(i))), note
        assert seen == {
            "a.bin": bytes([i % 256]) * 3_000_000,
            "b.bin": bytes([(i + 1) % 256]) * 1_000_000,
        }, note
        assert not [p for p in root.iterdir() if p.name.startswith(".")], (
            f"{note}: stale temp dirs not removed"
        )
