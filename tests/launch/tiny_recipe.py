"""A tiny but real recipe for the launcher tests: an MLP fit to noisy regression data, a few hundred steps.

It honours the recipe contract the launchers rely on (docs/design.md §3): a dataclass ``Config`` with the common
``run`` / ``logger`` / ``checkpoint`` sections, ``main(cfg) -> dict``, ``run.dir`` (launching again resumes from
the last checkpoint there), ``config.json`` and ``progress.csv`` during the run, ``summary.json`` with
``frames``, ``wall_s`` and ``eval/return_mean`` at the end. Checkpoints are written atomically at every iteration
(temp file, fsync, ``os.replace``) with the model, optimizer, data RNG and iteration, so a resumed run ends with
bitwise the same parameters as an uninterrupted one. ``summary.json`` also records the parameter hash and what
the process saw of its slot (affinity, thread and device variables) for the tests.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig, parse_args, to_dict


@dataclass
class TrainConfig:
    """The regression problem and its optimisation."""

    iterations: int = 30
    """Optimisation iterations (one progress row and one checkpoint each)."""
    batch_size: int = 64
    """Samples per iteration (counted as 'frames')."""
    lr: float = 1e-2
    """Adam learning rate."""
    hidden: int = 16
    """Hidden units of the MLP."""
    step_sleep_s: float = 0.0
    """Sleep per iteration, so tests can interrupt a run in the middle."""
    fail_at_iteration: int = -1
    """Raise an error at this iteration (tests of failing runs); -1 never."""


@dataclass
class Config:
    """Tiny regression recipe used by tests/launch."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def _run_dir(cfg: Config) -> Path:
    if cfg.run.dir:
        return Path(cfg.run.dir)
    stamp = time.strftime("%Y%m%d/%H%M%S")
    return Path(cfg.run.root) / f"{stamp}_{cfg.run.name or 'tiny'}" / f"run_{cfg.run.seed}"


def _save_atomic(obj: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _param_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def main(cfg: Config) -> dict:
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"run dir: {run_dir}", flush=True)
    torch.manual_seed(cfg.run.seed)
    torch.set_num_threads(cfg.run.torch_threads)
    (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))

    model = torch.nn.Sequential(
        torch.nn.Linear(1, cfg.train.hidden), torch.nn.Tanh(), torch.nn.Linear(cfg.train.hidden, 1)
    )
    optim = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    data_rng = torch.Generator().manual_seed(1000 + cfg.run.seed)
    eval_x = torch.linspace(-2, 2, 256).unsqueeze(-1)
    eval_y = torch.sin(2 * eval_x)
    start, resumed_from = 0, 0
    ckpt_path = run_dir / "checkpoint.pt"
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        data_rng.set_state(state["data_rng"])
        start = resumed_from = state["iteration"]
        print(f"resumed at iteration {start}", flush=True)

    progress = run_dir / "progress.csv"
    rows = []
    if (
        progress.exists() and start
    ):  # keep exactly the rows up to the checkpoint (no duplicates after a resume)
        with open(progress, newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["Iteration"]) < start]
    columns = ["Iteration", "CumSteps", "frames", "loss", "eval/return_mean", "time/wall_s"]
    with open(progress, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)

    t0 = time.time()
    eval_return = float("nan")
    for it in range(start, cfg.train.iterations):
        if it == cfg.train.fail_at_iteration:
            raise RuntimeError(f"tiny_recipe: failing on purpose at iteration {it}")
        x = torch.rand(cfg.train.batch_size, 1, generator=data_rng) * 4 - 2
        y = torch.sin(2 * x) + 0.05 * torch.randn(cfg.train.batch_size, 1, generator=data_rng)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        with torch.no_grad():
            eval_return = -torch.nn.functional.mse_loss(model(eval_x), eval_y).item()
        with open(progress, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=columns).writerow(
                {
                    "Iteration": it,
                    "CumSteps": (it + 1) * cfg.train.batch_size,
                    "frames": (it + 1) * cfg.train.batch_size,
                    "loss": f"{loss.item():.6g}",
                    "eval/return_mean": f"{eval_return:.6g}",
                    "time/wall_s": f"{time.time() - t0:.3f}",
                }
            )
        _save_atomic(
            {
                "model": model.state_dict(),
                "optim": optim.state_dict(),
                "data_rng": data_rng.get_state(),
                "iteration": it + 1,
            },
            ckpt_path,
        )
        if cfg.train.step_sleep_s:
            time.sleep(cfg.train.step_sleep_s)

    summary = {
        "frames": cfg.train.iterations * cfg.train.batch_size,
        "wall_s": time.time() - t0,
        "eval/return_mean": eval_return,
        "param_sha256": _param_hash(model),
        "resumed_from": resumed_from,
        "pid": os.getpid(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "env": {
            k: os.environ.get(k)
            for k in (
                "OMP_NUM_THREADS",
                "TDRL_SLOT",
                "TDRL_SLOT_CPUS",
                "CUDA_VISIBLE_DEVICES",
                "RANK",
                "WORLD_SIZE",
                "MASTER_ADDR",
                "MASTER_PORT",
            )
        },
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main(parse_args(Config(), sys.argv[1:]))
