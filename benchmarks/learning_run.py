"""One row of the learning benchmark as a resumable run: a task of ``benchmarks/learning.py``, tdrl or SB3, one seed.

The long reference runs (MuJoCo) take hours on 2 cores, so they go through the sweep launcher like any recipe:
this file has a recipe's shape (a dataclass ``Config`` and ``main(cfg)``), and a sweep file in ``slurm/sweeps/``
crosses tasks, implementations and seeds. Relaunching a stopped sweep resumes every run in its directory: tdrl's
runs exactly (the recipe's checkpoints), SB3's from their last checkpoint (see ``learning._sb3_curve``).

    python benchmarks/learning_run.py task=sac-hopper impl=sb3 run.seed=1 run.dir=runs/x   # one row
    python slurm/launch.py local slurm/sweeps/mujoco_offpolicy.py                          # the sweep
    python benchmarks/learning.py --runs runs/sweeps/mujoco_offpolicy --keep docs/data --plots docs/data \
        --markdown docs/mujoco.md#sac-and-td3                                          # its report, in place

A sweep's run directories (checkpoints, replays) stay outside the repository; ``--keep docs/data`` writes the
finished runs' evaluations to ``docs/data/<sweep>.csv``, to commit (the report is remade from it: ``--runs
docs/data/<sweep>.csv``). On a new machine, ``--runs docs/data/<sweep>.csv --unpack runs/sweeps`` before relaunching
writes those runs' files back: the launcher skips the runs already done.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's tdrl

from tdrl.config import ConfigError, NonNegativeInt, RunConfig, run_recipe  # noqa: E402
from tdrl.launch import Resources, Sweep, VariantLevel  # noqa: E402


@dataclass
class Config:
    task: str = "sac-hopper"
    """A task of benchmarks/learning.py (its env, budget, evaluation cadence and overrides)."""
    impl: Literal["tdrl", "sb3"] = "tdrl"
    """tdrl: the task's recipe; sb3: its Stable-Baselines3 baseline with RL-Zoo hyperparameters."""
    frames: NonNegativeInt = 0
    """Env frames instead of the task's budget (0: the budget); for a short check."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run directory (required: resuming needs one), seed and torch threads (both implementations: one each)."""

    def validate(self) -> None:
        import learning

        tasks = {t.name: t for t in learning.TASKS}
        if self.task not in tasks:
            raise ConfigError(f"task={self.task!r} is not a task of benchmarks/learning.py; choose from "
                              f"{', '.join(tasks)}")
        if self.impl == "sb3" and tasks[self.task].sb3 is None:
            raise ConfigError(f"task={self.task!r} has no SB3 baseline; use impl=tdrl")
        if not self.run.dir:
            raise ConfigError("run.dir is required: the run checkpoints there and a relaunch resumes it")


def main(cfg: Config) -> dict:
    import learning
    import torch

    task = next(t for t in learning.TASKS if t.name == cfg.task)
    if cfg.frames:
        task = dataclasses.replace(task, budget=cfg.frames)
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.run.torch_threads)
    torch.manual_seed(cfg.run.seed)
    if cfg.impl == "tdrl":
        curve = learning.run_tdrl(task, cfg.run.seed, run_dir.parent, run_dir=run_dir,
                                  extra=[f"run.torch_threads={cfg.run.torch_threads}"])
    else:
        assert task.sb3 is not None  # validate
        curve = task.sb3(cfg.run.seed, task, False, run_dir)
    return {"frames": curve[-1]["frames"], "curve": curve}


def rows_sweep(name: str, rows: list[tuple[str, str]], seeds: list[int], *, overrides: dict | None = None,
               time_min: int = 240) -> Sweep:
    """A sweep of learning rows ``(task, impl)``, each run in ``<name>/<task>/<impl>/run_<seed>`` on one core;
    seeds outer, so the first runs to finish cover every row once (the sweep files in ``slurm/sweeps/``)."""
    return Sweep(name=name, recipe=__file__, seeds=seeds, overrides=dict(overrides or {}),
                 levels=[VariantLevel(keys=["task", "impl"], values=[list(row) for row in rows],
                                      dir_names=[f"{task}/{impl}" for task, impl in rows])],
                 resources=Resources(cpus_per_run=1, mem_gb=8, time_min=time_min))


if __name__ == "__main__":
    run_recipe(main, Config(), prog="benchmarks/learning_run.py", doc=__doc__)
