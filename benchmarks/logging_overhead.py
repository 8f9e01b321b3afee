"""Cost of logging and checkpointing at a realistic size, every row measured in the same run.

Rows:

* ``log row (csv+console)`` — one :meth:`tdrl.log.Run.log` call with a realistic row (rlpyt columns plus
  Average/Std/Median/Min/Max of 4 episode and 4 optimizer statistics: 50 columns), W&B off.
* ``log row (+W&B offline)`` — the same with the W&B offline mirror.
* ``summarize (100 episodes, 4 fields)`` — building those statistics columns.
* ``torch.save in place`` — the baseline: rlpyt's ``torch.save(state, "params.pkl")`` (no fsync, no checksum,
  not crash-safe) of a SAC-sized state: actor 17→256→256→12, twin Q 23→256→256→1 and their targets, Adam
  states for actor, critic and temperature (``--obs 17 --act 6``, HalfCheetah's sizes).
* ``checkpoint SAC`` — :meth:`Run.save_checkpoint` of that state (temp dir, fsync, sha256 manifest, rename,
  rotation, RNG capture).
* ``checkpoint SAC + replay 100k`` — the same plus a TorchRL ``LazyMemmapStorage`` replay of ``--transitions``
  transitions written through ``extra_writers={"replay": rb.dumps}``.
* ``load+verify ...`` — :meth:`Run.load_checkpoint` (sha256 of every file, ``torch.load``, replay ``loads``).

Medians over ``--repeats``. Run from a temporary directory on the disk you train on (fsync cost depends on it)::

    cd $(mktemp -d) && python /path/to/benchmarks/logging_overhead.py [--quick]

(Not ``benchmarks/logging.py``: a script directory is first on ``sys.path``, so that name would shadow the
standard library's ``logging`` for every script in ``benchmarks/``.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, ReplayBuffer

from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig
from tdrl.log import Run, summarize_columns, summarize_records


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
        run.log(
            row,
            step=state["step"],
            iteration=state["step"] // 1000,
            updates=state["step"],
            update_batch_size=256,
            episodes=4,
        )

    with contextlib.redirect_stdout(
        io.StringIO()
    ):  # the console line is part of the cost, not the terminal
        return median_ms(one, repeats=5, inner=n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--transitions", type=int, default=100_000)
    parser.add_argument("--obs", type=int, default=17)
    parser.add_argument("--act", type=int, default=6)
    parser.add_argument(
        "--dir", default=None, help="where to write (default: a temp dir in the cwd)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_SILENT", "true")
    repeats = 3 if args.quick else 7
    root = Path(tempfile.mkdtemp(prefix="tdrl-bench-", dir=args.dir or os.getcwd()))
    rows: list[tuple[str, str, float, str]] = []
    try:
        run = open_run(root, "csv", wandb=False)
        rows.append(
            ("log row (csv+console)", "50 cols", log_rows(run, 20 if args.quick else 100), "")
        )
        run.finish()
        run = open_run(root, "wandb", wandb=True)
        rows.append(
            ("log row (+W&B offline)", "50 cols", log_rows(run, 20 if args.quick else 100), "")
        )
        with contextlib.redirect_stdout(io.StringIO()):
            run.finish()
        episodes = [{"return": float(i), "length": i, "a": 1.0, "b": 2.0} for i in range(100)]
        rows.append(
            (
                "summarize (100 episodes, 4 fields)",
                "",
                median_ms(lambda: summarize_records(episodes), repeats, 50),
                "",
            )
        )

        state = sac_state(args.obs, args.act)
        baseline_path = root / "params.pkl"
        base = median_ms(lambda: torch.save(state, baseline_path), repeats)
        size = baseline_path.stat().st_size / 1e6
        rows.append(("torch.save in place (rlpyt, unsafe)", f"{size:.1f} MB", base, "1.0x"))

        run = open_run(root, "ckpt", wandb=False)
        itr = iter(range(10**6))
        with contextlib.redirect_stdout(io.StringIO()):
            ms = median_ms(lambda: run.save_checkpoint(state, next(itr)), repeats)
        rows.append(
            ("checkpoint SAC (fsync, sha256, rotate)", f"{size:.1f} MB", ms, f"{ms / base:.1f}x")
        )
        with contextlib.redirect_stdout(io.StringIO()):
            ms = median_ms(lambda: run.load_checkpoint(), repeats)
        rows.append(("load+verify SAC", f"{size:.1f} MB", ms, f"{ms / base:.1f}x"))
        run.finish()

        rb = replay_buffer(root / "scratch", args.transitions, args.obs, args.act)
        run = open_run(root, "ckpt_rb", wandb=False)
        itr = iter(range(10**6))
        with contextlib.redirect_stdout(io.StringIO()):
            ms = median_ms(
                lambda: run.save_checkpoint(state, next(itr), extra_writers={"replay": rb.dumps}),
                repeats,
            )
        total = dir_mb(run.last_checkpoint.path)
        label = f"checkpoint SAC + replay {args.transitions // 1000}k"
        rows.append((label, f"{total:.1f} MB", ms, f"{ms / base:.1f}x"))
        rb2 = ReplayBuffer(
            storage=LazyMemmapStorage(args.transitions, scratch_dir=root / "scratch2"),
            batch_size=256,
        )
        with contextlib.redirect_stdout(io.StringIO()):
            ms = median_ms(
                lambda: run.load_checkpoint(extra_readers={"replay": rb2.loads}), repeats
            )
        rows.append(
            (
                f"load+verify SAC + replay {args.transitions // 1000}k",
                f"{total:.1f} MB",
                ms,
                f"{ms / base:.1f}x",
            )
        )
        assert len(rb2) == args.transitions
        run.finish()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    load = os.getloadavg()[0]
    print(
        f"\ntdrl logging/checkpoint cost (median of {repeats}; load average {load:.1f}; torch threads 1)\n"
    )
    print(f"| {'operation':<42} | {'size':>9} | {'ms':>9} | {'vs torch.save':>13} |")
    print(f"|{'-' * 44}|{'-' * 11}|{'-' * 11}|{'-' * 15}|")
    for name, size_text, ms, ratio in rows:
        print(f"| {name:<42} | {size_text:>9} | {ms:>9.3f} | {ratio:>13} |")


if __name__ == "__main__":
    main()
