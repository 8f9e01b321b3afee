"""What the SIGKILL tests share (tests/ckpt/test_kill.py, tests/recipes/test_resume.py, the SLURM preemption
test): kill a run at a chosen point, and compare two runs bitwise (progress.csv minus its wall-time columns,
checkpoint states tensor by tensor)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdrl.log import is_wall_time_column, read_progress

WALL_TIME_STATE_KEYS = frozenset({"train_s", "eval_s", "train_s_at_log", "phase_s", "cum_time", "wandb_id"})
"""Checkpoint entries that measure wall-clock time (or name the W&B run), so differ between equal runs."""


def progress_rows(path: Path) -> int:
    """Rows of a progress.csv (0 while it does not exist)."""
    try:
        with open(path) as f:
            return max(sum(1 for _ in f) - 1, 0)
    except FileNotFoundError:
        return 0


def checkpoints(run_dir: Path) -> list[Path]:
    """A run's published checkpoint directories, oldest first (temp dirs start with a dot)."""
    return sorted((Path(run_dir) / "checkpoints").glob("itr_*"))


def newest_state(run_dir: Path) -> dict[str, Any]:
    """The newest checkpoint's ``state.pt`` (as ``Run.save_checkpoint`` wrote it)."""
    return torch.load(checkpoints(run_dir)[-1] / "state.pt", weights_only=False)


def deterministic_progress(run_dir: Path) -> tuple[list[str], list[list[str]]]:
    """progress.csv's header and rows without the wall-time columns."""
    header, rows = read_progress(Path(run_dir) / "progress.csv")
    keep = [k for k in header if not is_wall_time_column(k)]
    return keep, [[r[k] for k in keep] for r in rows]


def assert_same_progress(reference: Path, run_dir: Path, note: str) -> None:
    """progress.csv of ``run_dir`` equals ``reference``'s minus wall-time columns; names the first differing row
    and its differing columns."""
    ref_header, ref_rows = deterministic_progress(reference)
    header, rows = deterministic_progress(run_dir)
    assert header == ref_header, f"{note}: progress.csv columns differ"
    for i, (ref_row, row) in enumerate(zip(ref_rows, rows, strict=False)):
        diff = {k: (a, b) for k, a, b in zip(header, ref_row, row, strict=True) if a != b}
        assert not diff, f"{note}: progress.csv row {i} differs (column: (reference, relaunched)): {diff}"
    assert len(rows) == len(ref_rows), f"{note}: {len(rows)} progress.csv rows, reference {len(ref_rows)}"


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    """Wait for a launched run; its output, asserting it succeeded."""
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], delay: float, note: str,
              timeout: float = 120) -> None:
    """SIGKILL ``proc`` ``delay`` seconds after ``ready()`` first holds; assert it was still running. A process
    started with ``start_new_session=True`` is killed with its whole group (ranks, workers), as a lost node is."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"{note}: the run ended before the kill point:\n{proc.communicate()[0]}"
        assert time.monotonic() < deadline, f"{note}: kill point not reached in {timeout:.0f} s"
        time.sleep(0.002)
    time.sleep(delay)
    if os.getpgid(proc.pid) == proc.pid:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"{note}: the run ended before the kill:\n{out}"


def assert_same_tree(a: Any, b: Any, note: str, path: str = "") -> None:
    """Assert two checkpoint states are equal: tensors and arrays bitwise (dtype and shape too), containers key by
    key; entries that measure wall-clock time (:data:`WALL_TIME_STATE_KEYS`, wall-time columns) are skipped."""
    where = f"{note}: {path or '<root>'}"
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping) and a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            if isinstance(key, str) and (key in WALL_TIME_STATE_KEYS or is_wall_time_column(key)):
                continue
            assert_same_tree(a[key], b[key], note, f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {type(a).__name__}[{len(a)}] != {b!r:.200}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tree(x, y, note, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a!r} != {b!r}"
        assert torch.equal(a, b), f"{where}: tensors differ"
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a!r} != {b!r}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), f"{where}: arrays differ"
    elif isinstance(a, float) and a != a:  # NaN
        assert isinstance(b, float) and b != b, f"{where}: nan != {b!r}"
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r:.200} != {b!r:.200}"


def assert_same_replay(reference: Path, run_dir: Path, note: str) -> None:
    """The newest checkpoints' replay components (``replay/``) are equal: the state (counters, sampler, RNG), the
    layout and version of every data segment, and each segment file's bytes. Runs without a replay pass."""
    ref, got = checkpoints(reference)[-1] / "replay", checkpoints(run_dir)[-1] / "replay"
    assert ref.is_dir() == got.is_dir(), f"{note}: only one of the runs checkpoints a replay"
    if not ref.is_dir():
        return
    states = [torch.load(d / "replay_state.pt", weights_only=False) for d in (ref, got)]
    assert_same_tree(*states, note, "replay/replay_state.pt")
    indexes = [json.loads((d / "segments" / "index.json").read_text())["fields"] for d in (ref, got)]
    assert indexes[0] == indexes[1], f"{note}: the replay segments differ in layout or version"
    for file in sorted((ref / "segments").glob("*.bin")):
        assert file.read_bytes() == (got / "segments" / file.name).read_bytes(), f"{note}: replay {file.name} differs"
