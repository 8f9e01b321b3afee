"""Cost of logging and checkpointing at a realistic size, every row measured in the same run.

Rows (``ms`` is the median over ``--repeats``; ``baseline`` is the unsafe way to do the same, timed alongside):

* ``log row`` — one :meth:`tdrl.log.Run.log` call with a realistic row (rlpyt columns plus
  Average/Std/Median/Min/Max of 4 episode and 4 optimizer statistics: 50 columns): CSV + console line, then
  also with the W&B offline mirror.
* ``summarize`` — building those statistics columns from 100 episodes.
* ``save SAC`` — :meth:`Run.save_checkpoint` (temp dir, fsync, sha256 manifest, rename, rotation, RNG capture)
  of a SAC-sized state: actor 17→256→256→12, twin Q 23→256→256→1 and their targets, Adam states for actor,
  critic and temperature (``--obs 17 --act 6``, HalfCheetah's sizes). Baseline: rlpyt's
  ``torch.save(state, "params.pkl")`` in place (no fsync, no checksum; unloadable after a kill mid-write).
* ``load SAC`` — what a resume pays: :func:`tdrl.ckpt.read_checkpoint` (sha256 of every file, then ``torch.load``;
  ``Run.open`` verifies, ``Run.load_checkpoint`` then loads without hashing again). Baseline: ``torch.load``.
* ``save/load SAC + replay`` — the same plus a TorchRL ``LazyMemmapStorage`` replay of ``--transitions``
  transitions through ``extra_writers={"replay": rb.dumps}`` / ``extra_readers={"replay": rb.loads}``.
  Baseline: ``torch.save`` + ``rb.dumps`` / ``torch.load`` + ``rb.loads`` into a plain directory.

Run from a temporary directory on the disk you train on (fsync cost depends on it)::

    cd $(mktemp -d) && python /path/to/benchmarks/logging_overhead.py [--quick]

``--sac-recipe`` measures instead the checkpoint a real ``recipes/sac.py`` run saves (Pendulum-v1, its defaults:
the loss, both updaters, the replay with its data, the collector and trainer state): every save of a
``--sac-frames`` run with one checkpoint per ``--sac-every`` frames is timed around the trainer's
``_save_checkpoint`` (collector state capture, torch.save, replay copy, fsync, sha256 manifest, rotation), and the
table gives the median. ``--trees A B ...`` runs that measurement on other checkouts (each tree's ``tdrl`` and
``recipes/sac.py``, one subprocess per tree and round, rounds interleaved) and gives each tree's ratio to the first::

    git worktree add /tmp/old e69dfe2
    python benchmarks/logging_overhead.py --trees /tmp/old . --rounds 3

Replay checkpoints (what a checkpoint of a big replay writes and keeps on disk; disk use as ``du`` counts it:
allocated blocks, each hard-linked file once):

* ``--pong``: the checkpoints a real ``recipes/dqn.py env.id=ALE/Pong-v5 collector.total_frames=512`` run leaves
  (100k-transition replay of ``[4, 84, 84]`` observations and next observations), on this checkout or on each of
  ``--trees``, ratio to the first. ``--pong-runs``: override sets; the defaults turn evaluation off (it plays whole
  Pong games for minutes and writes no replay), and the recipe rounds 512 frames up to its 5000-frame log interval
  unless ``logger.log_interval_steps=512``.
* ``--replay-growth``: ``--growth-frames`` synthetic Atari frames (random ``84x84`` frames in ``[B, T]`` batches
  of stacks, as a collector gives them) into a ``--growth-capacity`` frame-de-duplicated prioritized
  :class:`~tdrl.replay.TransitionReplayBuffer`, checkpointed every ``--growth-every`` frames (``snapshot_mode=last``):
  per checkpoint the bytes the buffer stored since the one before, the bytes the checkpoint wrote (files it did not
  link) and their ratio, then the disk the two kept checkpoints take against the replay's own directory::

    git worktree add /tmp/base efbc6ad
    python benchmarks/logging_overhead.py --trees /tmp/base . --pong --replay-growth \
        --markdown docs/throughput.md#logging-and-checkpoints

(Not ``benchmarks/logging.py``: a script's directory is first on ``sys.path``, so that name would shadow the
standard library's ``logging`` for every script in ``benchmarks/``.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, ReplayBuffer

TREE_VAR = "TDRL_BENCH_TREE"
# this checkout's tdrl (not another installed copy), or the tree --trees measures in this subprocess
sys.path.insert(1, os.environ.get(TREE_VAR) or str(Path(__file__).resolve().parents[1]))
from tdrl.ckpt import read_checkpoint  # noqa: E402
from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig  # noqa: E402
from tdrl.log import Run, summarize_columns, summarize_records  # noqa: E402


def _mlp(sizes: list[int]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def sac_state(obs: int, act: int) -> dict:
    """Model and optimizer state dicts of a SAC agent, with Adam moments filled in by one update."""
    actor = _mlp([obs, 256, 256, 2 * act])
    q1, q2 = _mlp([obs + act, 256, 256, 1]), _mlp([obs + act, 256, 256, 1])
    q1_target, q2_target = _mlp([obs + act, 256, 256, 1]), _mlp([obs + act, 256, 256, 1])
    log_alpha = torch.zeros(1, requires_grad=True)
    optims = {
        "actor": torch.optim.Adam(actor.parameters(), lr=3e-4),
        "critic": torch.optim.Adam([*q1.parameters(), *q2.parameters()], lr=3e-4),
        "alpha": torch.optim.Adam([log_alpha], lr=3e-4),
    }
    x = torch.randn(256, obs + act)
    loss = actor(x[:, :obs]).pow(2).mean() + q1(x).mean() + q2(x).mean() + log_alpha.sum()
    loss.backward()
    for opt in optims.values():
        opt.step()
    return {
        "actor": actor.state_dict(),
        "q1": q1.state_dict(),
        "q2": q2.state_dict(),
        "q1_target": q1_target.state_dict(),
        "q2_target": q2_target.state_dict(),
        "log_alpha": log_alpha.detach(),
        **{f"optim_{k}": v.state_dict() for k, v in optims.items()},
        "counters": {"itr": 1000, "frames": 1_000_000, "updates": 1_000_000},
    }


def replay_buffer(scratch: Path, transitions: int, obs: int, act: int) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyMemmapStorage(transitions, scratch_dir=scratch), batch_size=256)
    chunk = 10_000
    for start in range(0, transitions, chunk):
        n = min(chunk, transitions - start)
        rb.extend(
            TensorDict(
                {
                    "observation": torch.randn(n, obs),
                    "action": torch.randn(n, act),
                    "next": {
                        "observation": torch.randn(n, obs),
                        "reward": torch.randn(n, 1),
                        "done": torch.zeros(n, 1, dtype=torch.bool),
                        "terminated": torch.zeros(n, 1, dtype=torch.bool),
                        "truncated": torch.zeros(n, 1, dtype=torch.bool),
                    },
                },
                batch_size=[n],
            )
        )
    return rb


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def median_ms(fn: Callable[[], object], repeats: int, inner: int = 1) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times) * 1e3


def open_run(root: Path, name: str, wandb: bool, snapshot_mode: str = "last") -> Run:
    cfg = {"bench": name}
    with contextlib.redirect_stdout(io.StringIO()):
        return Run.open(
            config=cfg,
            run=RunConfig(dir=str(root / name)),
            logger=LoggerConfig(wandb=wandb, wandb_mode="offline", progress_bar=False),
            checkpoint=CheckpointConfig(snapshot_mode=snapshot_mode),  # type: ignore[arg-type]
            name=name,
            tee=False,
        )


def log_rows(run: Run, n: int) -> float:
    episodes = [
        {"return": float(i), "length": 100 + i, "discounted_return": 0.5 * i, "nonzero_rewards": i}
        for i in range(100)
    ]
    losses = {f"loss/{k}": torch.rand(50) for k in ("actor", "qvalue", "alpha", "entropy")}
    row = {**summarize_records(episodes, "train/"), **summarize_columns(losses)}
    state = {"step": 0}

    def one() -> None:
        state["step"] += 1000
        run.log(row, step=state["step"], iteration=state["step"] // 1000)

    with contextlib.redirect_stdout(
        io.StringIO()
    ):  # the console line is part of the cost, not the terminal
        return median_ms(one, repeats=5, inner=n)


def sac_recipe_saves(recipe: Path, root: Path, frames: int, every: int, replay_size: int) -> dict:
    """Seconds of every checkpoint a ``recipes/sac.py`` run saves, and the newest checkpoint's size in MB.

    Uses only what the tree at e69dfe2 already has (load_recipe, apply_overrides, the sync trainer's
    ``_save_checkpoint``), so the same function measures the old tree and the new one.
    """
    from tdrl.config import apply_overrides
    from tdrl.launch.recipe import load_recipe
    from tdrl.train.sync import SyncTrainer

    module = load_recipe(recipe)
    cfg = apply_overrides(module.Config(), [
        f"run.dir={root / 'run'}", "logger.wandb=false", "logger.progress_bar=false",
        f"collector.total_frames={frames}", f"logger.log_interval_steps={every}", f"checkpoint.interval_steps={every}",
        f"replay.size={replay_size}",
    ])
    seconds: list[float] = []
    save = SyncTrainer._save_checkpoint

    def timed_save(trainer: Any) -> None:
        start = time.perf_counter()
        save(trainer)
        seconds.append(time.perf_counter() - start)

    with mock.patch.object(SyncTrainer, "_save_checkpoint", timed_save), contextlib.redirect_stdout(io.StringIO()):
        module.main(cfg)
    newest = max((root / "run" / "checkpoints").glob("itr_*"))
    return {"seconds": seconds, "mb": dir_mb(newest)}


def sac_recipe_table(args: argparse.Namespace) -> None:
    """Median save time of the SAC recipe's checkpoint on this checkout, or on each of ``--trees``."""
    here = Path(__file__).resolve().parents[1]
    trees = [Path(t).resolve() for t in args.trees] if args.trees else [here]
    seconds: dict[Path, list[float]] = {tree: [] for tree in trees}
    sizes: dict[Path, float] = {}
    sizes_args = [f"--sac-frames={args.sac_frames}", f"--sac-every={args.sac_every}", f"--sac-replay={args.sac_replay}"]
    for _ in range(args.rounds if args.trees else 1):
        for tree in trees:
            with tempfile.TemporaryDirectory(prefix="tdrl-bench-sac-", dir=args.dir or os.getcwd()) as tmp:
                if args.trees:  # the tree's own tdrl and recipe, in a process of their own
                    out = Path(tmp) / "saves.json"
                    env = {**os.environ, TREE_VAR: str(tree)}
                    subprocess.run([sys.executable, __file__, "--sac-child", str(out), *sizes_args], env=env,
                                   cwd=tmp, check=True)
                    result = json.loads(out.read_text())
                    if Path(result["tdrl"]) != tree / "tdrl":
                        raise RuntimeError(f"the subprocess for {tree} imported {result['tdrl']}")
                else:
                    result = sac_recipe_saves(tree / "recipes" / "sac.py", Path(tmp), args.sac_frames,
                                              args.sac_every, args.sac_replay)
            seconds[tree] += result["seconds"]
            sizes[tree] = result["mb"]
    print(f"\nrecipes/sac.py checkpoint save (Pendulum-v1, {args.sac_frames} frames, one save per {args.sac_every}, "
          f"replay.size={args.sac_replay}; load average {os.getloadavg()[0]:.1f})\n")
    print(f"| {'tree':<40} | {'saves':>5} | {'median ms':>9} | {'min ms':>7} | {'MB':>6} | {'ratio':>6} |")
    print(f"|{'-' * 42}|{'-' * 7}|{'-' * 11}|{'-' * 9}|{'-' * 8}|{'-' * 8}|")
    first = statistics.median(seconds[trees[0]])
    for tree in trees:
        median = statistics.median(seconds[tree])
        print(f"| {str(tree)[-40:]:<40} | {len(seconds[tree]):>5} | {median * 1e3:9.1f} | "
              f"{min(seconds[tree]) * 1e3:7.1f} | {sizes[tree]:6.1f} | {median / first:5.2f}x |")


def tree_commits(trees: list[Path]) -> None:
    """Print which commit each compared tree is at (a tree path says nothing about its code)."""
    for tree in trees:
        def git(*args: str, at: Path = tree) -> str:
            return subprocess.run(["git", "-C", str(at), *args], capture_output=True, text=True).stdout.strip()

        dirty = " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
        print(f"tree {tree}: commit {git('rev-parse', '--short', 'HEAD') or 'unknown'}{dirty}")


PONG_ARGS = ("env.id=ALE/Pong-v5", "collector.total_frames=512", "logger.wandb=false", "logger.progress_bar=false")


def pong_checkpoints(tree: Path, root: Path, extra: list[str]) -> dict:
    """Run ``tree``'s ``recipes/dqn.py`` on Pong with ``tree``'s tdrl; what it collected and leaves on disk."""
    from tdrl.utils.files import disk_bytes

    run_dir = root / "run"
    start = time.perf_counter()
    subprocess.run([sys.executable, str(tree / "recipes" / "dqn.py"), *PONG_ARGS, *extra, f"run.dir={run_dir}"],
                   env={**os.environ, "PYTHONPATH": str(tree)}, cwd=root, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    kept = sorted((run_dir / "checkpoints").glob("itr_*"))
    return {"frames": json.loads((run_dir / "summary.json").read_text())["frames"], "kept": len(kept),
            "layout": "segments" if (kept[-1] / "replay" / "segments").is_dir() else "whole files",
            "disk": disk_bytes(run_dir / "checkpoints"), "in_replay": disk_bytes(*(c / "replay" for c in kept)),
            "replay_dir": disk_bytes(run_dir / "replay"), "seconds": seconds}


def pong_table(args: argparse.Namespace) -> None:
    """(a) Disk use of the Pong run's checkpoints, for each ``--pong-runs`` override set, on this checkout or each of
    ``--trees`` (ratio to the first)."""
    here = Path(__file__).resolve().parents[1]
    trees = [Path(t).resolve() for t in args.trees] if args.trees else [here]
    rows = []
    for overrides in args.pong_runs:
        for tree in trees:
            with tempfile.TemporaryDirectory(prefix="tdrl-bench-pong-", dir=args.dir or os.getcwd()) as tmp:
                rows.append((overrides, tree, pong_checkpoints(tree, Path(tmp), overrides.split())))
    print(f"\nrecipes/dqn.py {' '.join(PONG_ARGS[:2])} + overrides: checkpoints/ after the run (du: allocated blocks, "
          "hard links once; 'of it replay/': the checkpoints' replay folders; 'replay dir': the run's own replay/)\n")
    print(f"| {'overrides':<44} | {'tree':<20} | {'layout':<11} | {'frames':>6} | {'kept':>4} | {'du MB':>8} | "
          f"{'of it replay/':>13} | {'replay dir MB':>13} | {'run s':>5} | {'ratio':>6} |")
    print("|" + "|".join("-" * n for n in (46, 22, 13, 8, 6, 10, 15, 15, 7, 8)) + "|")
    for i, (overrides, tree, r) in enumerate(rows):
        first = rows[i - i % len(trees)][2]["disk"]
        print(f"| {overrides:<44} | {str(tree)[-20:]:<20} | {r['layout']:<11} | {r['frames']:>6} | {r['kept']:>4} | "
              f"{r['disk'] / 1e6:8.1f} | {r['in_replay'] / 1e6:13.1f} | {r['replay_dir'] / 1e6:13.1f} | "
              f"{r['seconds']:5.0f} | {r['disk'] / first:5.3f}x |")


class SyntheticAtari:
    """``[B, T]`` collector-like batches of ``[4, 84, 84]`` uint8 stacks over random frames: one new frame per step,
    the next stack one frame later; ``done`` about every ``mean_len`` steps (the replay stores the final frame
    again), the stacks running on across it (``is_init`` only at the very start)."""

    def __init__(self, num_streams: int, seed: int, mean_len: int = 1000) -> None:
        self.rng = np.random.default_rng(seed)
        self.mean_len = mean_len
        first = torch.from_numpy(self.rng.integers(0, 256, (num_streams, 1, 84, 84), dtype=np.uint8))
        self.stack = torch.cat([torch.zeros(num_streams, 3, 84, 84, dtype=torch.uint8), first], 1)  # zero-padded
        self.started = False

    def batch(self, steps: int) -> TensorDict:
        B = self.stack.shape[0]
        frames = torch.cat([self.stack, torch.from_numpy(self.rng.integers(0, 256, (B, steps, 84, 84),
                                                                           dtype=np.uint8))], 1)
        stacks = frames.unfold(1, 4, 1).permute(0, 1, 4, 2, 3)  # [B, steps + 1, 4, 84, 84] views
        is_init = torch.zeros(B, steps, 1, dtype=torch.bool)
        is_init[:, 0] = not self.started
        self.stack, self.started = frames[:, -4:].clone(), True
        done = torch.from_numpy(self.rng.random((B, steps, 1)) < 1 / self.mean_len)
        return TensorDict({
            "observation": stacks[:, :-1], "is_init": is_init,
            "action": torch.from_numpy(self.rng.integers(0, 6, (B, steps))),
            "next": {"observation": stacks[:, 1:], "reward": torch.zeros(B, steps, 1), "done": done,
                     "terminated": done, "truncated": torch.zeros_like(done)},
        }, batch_size=[B, steps])


def new_files(path: Path, before: Path | None) -> list[Path]:
    """Files of checkpoint ``path`` that are not hard links of a file in ``before`` (what writing it wrote)."""
    seen = {f.stat().st_ino for f in before.rglob("*") if f.is_file()} if before is not None else set()
    return [f for f in path.rglob("*") if f.is_file() and f.stat().st_ino not in seen]


def replay_growth_table(args: argparse.Namespace) -> None:
    """(b) Bytes each checkpoint of a growing 1M-frame Atari replay writes, against the bytes stored since the one
    before; the disk the two kept checkpoints take."""
    from tdrl.ckpt import Checkpointer
    from tdrl.replay import FrameStack, PrioritizedSampler, TransitionReplayBuffer
    from tdrl.replay.segments import field_cursors
    from tdrl.utils.files import disk_bytes

    B, T = 8, 125  # rlpyt's Atari batch_B; 1000 frames per extend
    root = Path(tempfile.mkdtemp(prefix="tdrl-bench-growth-", dir=args.dir or os.getcwd()))
    rows = []
    try:
        rb = TransitionReplayBuffer(root / "replay", args.growth_capacity, frame_stack=FrameStack(4), seed=0,
                                    sampler=PrioritizedSampler(alpha=0.6, beta_steps=args.growth_capacity, seed=0))
        source, ckpt = SyntheticAtari(B, seed=0), Checkpointer(root / "checkpoints", snapshot_mode="last")
        stored: dict[str, Any] = {}
        previous: Path | None = None
        for i in range(args.growth_frames // args.growth_every):
            for _ in range(args.growth_every // (B * T)):
                rb.extend(source.batch(T))
            cursors = field_cursors(rb.ring.store)
            added = 0
            for name, field in rb.ring.store.fields.items():
                entry = field[0, 0].numel() * field.element_size()
                c = cursors[name]
                added += entry * int((c - stored.get(name, 0)).sum()) if c is not None else field.numel() * entry
            stored = {name: c for name, c in cursors.items() if c is not None}
            start = time.perf_counter()
            path = ckpt.save({}, i, extra_writers={"replay": rb.checkpoint_writer()})
            seconds = time.perf_counter() - start
            assert path is not None  # snapshot_mode="last" keeps every save's directory until the next
            files = new_files(path, previous)
            data = sum(f.stat().st_size for f in files if f.suffix == ".bin")
            total = sum(f.stat().st_size for f in files)
            linked = sum(1 for f in (path / "replay" / "segments").glob("*.bin") if f not in files)
            rows.append((rb.write_count, added, data, total, linked, len(files), seconds))
            previous = path
        kept, replay_dir = disk_bytes(root / "checkpoints"), disk_bytes(root / "replay")
        capacity = rb.ring.store.nbytes()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.growth_frames:,} Atari frames into a {args.growth_capacity:,}-frame frame-de-duplicated "
          f"prioritized replay (B={B}), a checkpoint every {args.growth_every:,} (snapshot_mode=last)\n")
    print(f"| {'frames':>8} | {'added MB':>8} | {'data written MB':>15} | {'all written MB':>14} | "
          f"{'written/added':>13} | {'linked':>6} | {'new files':>9} | {'save s':>6} |")
    print(f"|{'-' * 10}|{'-' * 10}|{'-' * 17}|{'-' * 16}|{'-' * 15}|{'-' * 8}|{'-' * 11}|{'-' * 8}|")
    for frames, added, data, total, linked, n_new, seconds in rows:
        print(f"| {frames:>8,} | {added / 1e6:8.1f} | {data / 1e6:15.1f} | {total / 1e6:14.1f} | "
              f"{total / added:12.3f}x | {linked:>6} | {n_new:>9} | {seconds:6.2f} |")
    print(f"\nthe two kept checkpoints: {kept / 1e6:.1f} MB on disk; the replay's own directory: "
          f"{replay_dir / 1e6:.1f} MB on disk ({kept / replay_dir:.3f}x); its field files' size: "
          f"{capacity / 1e6:.1f} MB (what a checkpoint copying whole files wrote each time)")


def main() -> None:
    from report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_markdown_option(parser)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--transitions", type=int, default=100_000)
    parser.add_argument("--obs", type=int, default=17)
    parser.add_argument("--act", type=int, default=6)
    parser.add_argument(
        "--dir", default=None, help="where to write (default: a temp dir in the cwd)"
    )
    parser.add_argument("--sac-recipe", action="store_true", help="only the recipes/sac.py checkpoint save table")
    parser.add_argument("--trees", nargs="+", help="checkouts to compare (alone: implies --sac-recipe)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per tree with --trees, interleaved")
    parser.add_argument("--sac-frames", type=int, default=2000)
    parser.add_argument("--sac-every", type=int, default=250)
    parser.add_argument("--sac-replay", type=int, default=100_000, help="replay.size (the recipe's default)")
    parser.add_argument("--sac-child", help=argparse.SUPPRESS)  # --trees: write this tree's saves as JSON here
    parser.add_argument("--pong", action="store_true", help="disk use of a 512-frame recipes/dqn.py Pong run's "
                        "checkpoints (on each of --trees)")
    parser.add_argument("--pong-runs", nargs="+",
                        default=["eval.n_envs=0", "eval.n_envs=0 logger.log_interval_steps=512"],
                        help="override sets of those runs, one quoted string each (the recipe rounds 512 frames up "
                        "to a log interval: 5000 frames unless the second)")
    parser.add_argument("--replay-growth", action="store_true", help="bytes each checkpoint of a growing Atari "
                        "replay writes")
    parser.add_argument("--growth-frames", type=int, default=200_000)
    parser.add_argument("--growth-every", type=int, default=50_000)
    parser.add_argument("--growth-capacity", type=int, default=1_000_000)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    if args.sac_child:
        import tdrl

        recipe = Path(tdrl.__file__).resolve().parents[1] / "recipes" / "sac.py"
        result = sac_recipe_saves(recipe, Path.cwd(), args.sac_frames, args.sac_every, args.sac_replay)
        Path(args.sac_child).write_text(json.dumps({**result, "tdrl": str(recipe.parents[1] / "tdrl")}))
        return
    if args.sac_recipe or args.trees or args.pong or args.replay_growth:
        if args.trees:
            tree_commits([Path(t).resolve() for t in args.trees])
        if args.sac_recipe or (args.trees and not (args.pong or args.replay_growth)):
            sac_recipe_table(args)
        if args.pong:
            pong_table(args)
        if args.replay_growth:
            replay_growth_table(args)
        return
    torch.set_num_threads(1)
    repeats = 3 if args.quick else 7
    root = Path(tempfile.mkdtemp(prefix="tdrl-bench-", dir=args.dir or os.getcwd()))
    rows: list[tuple[str, str, float, float | None]] = []  # name, size, ms, baseline ms
    try:
        n_rows = 20 if args.quick else 100
        run = open_run(root, "csv", wandb=False)
        rows.append(("log row (csv + console)", "50 cols", log_rows(run, n_rows), None))
        run.finish()
        run = open_run(root, "wandb", wandb=True)
        rows.append(
            ("log row (csv + console + W&B offline)", "50 cols", log_rows(run, n_rows), None)
        )
        with contextlib.redirect_stdout(io.StringIO()):
            run.finish()
        episodes = [{"return": float(i), "length": i, "a": 1.0, "b": 2.0} for i in range(100)]
        ms = median_ms(lambda: summarize_records(episodes), repeats, 50)
        rows.append(("summarize 100 episodes x 4 fields", "", ms, None))

        state = sac_state(args.obs, args.act)
        plain = root / "plain"
        plain.mkdir()
        save_base = median_ms(lambda: torch.save(state, plain / "params.pkl"), repeats)
        load_base = median_ms(lambda: torch.load(plain / "params.pkl", weights_only=False), repeats)
        size = f"{(plain / 'params.pkl').stat().st_size / 1e6:.1f} MB"
        run = open_run(root, "ckpt", wandb=False)
        itr = iter(range(10**6))
        with contextlib.redirect_stdout(io.StringIO()):
            rows.append(
                (
                    "save SAC",
                    size,
                    median_ms(lambda: run.save_checkpoint(state, next(itr)), repeats),
                    save_base,
                )
            )
            assert run.last_checkpoint is not None
            newest = run.last_checkpoint.path
            rows.append(("load SAC", size, median_ms(lambda: read_checkpoint(newest), repeats), load_base))
        run.finish()

        rb = replay_buffer(root / "scratch", args.transitions, args.obs, args.act)
        rb_plain = ReplayBuffer(
            storage=LazyMemmapStorage(args.transitions, scratch_dir=root / "s1"), batch_size=256
        )
        rb_load = ReplayBuffer(
            storage=LazyMemmapStorage(args.transitions, scratch_dir=root / "s2"), batch_size=256
        )

        def plain_save() -> None:
            shutil.rmtree(plain / "replay", ignore_errors=True)
            torch.save(state, plain / "params.pkl")
            (plain / "replay").mkdir()
            rb.dumps(plain / "replay")

        def plain_load() -> None:
            torch.load(plain / "params.pkl", weights_only=False)
            rb_plain.loads(plain / "replay")

        save_base = median_ms(plain_save, repeats)
        load_base = median_ms(plain_load, repeats)
        run = open_run(root, "ckpt_rb", wandb=False)
        itr = iter(range(10**6))
        label = f"SAC + replay {args.transitions // 1000}k"
        with contextlib.redirect_stdout(io.StringIO()):
            ms = median_ms(
                lambda: run.save_checkpoint(state, next(itr), extra_writers={"replay": rb.dumps}),
                repeats,
            )
            assert run.last_checkpoint is not None
            saved = run.last_checkpoint.path
            size = f"{dir_mb(saved):.1f} MB"
            rows.append((f"save {label}", size, ms, save_base))
            ms = median_ms(lambda: read_checkpoint(saved, extra_readers={"replay": rb_load.loads}), repeats)
            rows.append((f"load {label}", size, ms, load_base))
        assert len(rb_load) == args.transitions
        run.finish()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    load = os.getloadavg()[0]
    print(
        f"\ntdrl logging/checkpoint cost (median of {repeats}; load average {load:.1f}; torch threads 1)\n"
    )
    print(f"| {'operation':<38} | {'size':>8} | {'ms':>8} | {'baseline ms':>11} | {'ratio':>6} |")
    print(f"|{'-' * 40}|{'-' * 10}|{'-' * 10}|{'-' * 13}|{'-' * 8}|")
    for name, size_text, ms, base in rows:
        base_text = f"{base:11.1f}" if base is not None else " " * 11
        ratio = f"{ms / base:5.1f}x" if base is not None else " " * 6
        print(f"| {name:<38} | {size_text:>8} | {ms:8.2f} | {base_text} | {ratio} |")


if __name__ == "__main__":
    from report import markdown_page

    with markdown_page("Logging and checkpoints"):  # --markdown PAGE#SECTION: into its docs section
        main()
