"""A recipe run as a submitit job that requeues itself on preemption and before its time limit.

The job calls the recipe's ``main(cfg)`` in its own process, so submitit's USR2 handler lives in the process that
trains. On USR2 submitit calls :meth:`RecipeJob.checkpoint`, which requeues the same job on the same ``run.dir``;
the recipe resumes there from its last checkpoint. Rank 0 appends each start, requeue and failure to
``<run dir>/launch_events.jsonl`` for ``status``.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tdrl.config import apply_overrides
from tdrl.launch.distributed import export_dist_env, slurm_dist_env
from tdrl.launch.recipe import load_recipe
from tdrl.launch.slots import format_cpus

__all__ = ["RecipeJob", "record_event"]


def record_event(run_dir: str | os.PathLike, event: str, **fields: Any) -> None:
    """Append one JSON line ``{"event": ..., "time": ..., ...}`` to ``<run_dir>/launch_events.jsonl``."""
    path = Path(run_dir) / "launch_events.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"event": event, "time": time.time(), **fields}, default=str)
    with open(path, "a") as f:
        f.write(line + "\n")


def _job_fields() -> dict[str, Any]:
    env = os.environ
    array = env.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{env['SLURM_ARRAY_TASK_ID']}" if array else env.get("SLURM_JOB_ID", "")
    return {"job_id": job, "restart": int(env.get("SLURM_RESTART_COUNT", "0")), "host": socket.gethostname()}


def _follow_allocation() -> None:
    """Let torch threads and collectors follow the cores SLURM gave this task (like a local slot)."""
    cpus = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("TDRL_SLOT_CPUS", format_cpus(cpus))
    os.environ.setdefault("OMP_NUM_THREADS", str(len(cpus)))
    os.environ.setdefault("MKL_NUM_THREADS", str(len(cpus)))


@dataclass
class RecipeJob:
    """Run the recipe file at ``recipe`` with ``overrides`` (``key=value`` strings, including ``run.dir``, which
    is also ``run_dir``, where events are recorded) as one SLURM job."""

    recipe: str
    overrides: list[str]
    run_dir: str

    def __call__(self) -> dict[str, Any]:
        """Run the recipe in this process and return its summary dict (submitit's job result)."""
        _follow_allocation()
        rank = int(os.environ.get("SLURM_PROCID", "0"))
        if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
            export_dist_env(slurm_dist_env())  # torchrun-style env:// variables for data-parallel trainers
        if rank == 0:
            record_event(self.run_dir, "start", **_job_fields())
        try:
            module = load_recipe(self.recipe)
            cfg = apply_overrides(module.Config(), self.overrides)
            summary = module.main(cfg)
        except Exception as e:
            if rank == 0:
                record_event(self.run_dir, "error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
            raise
        if rank == 0:
            record_event(self.run_dir, "end", **_job_fields())
        return summary

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Requeue this same job; it resumes from ``run_dir`` (called by submitit on USR2, rank 0 only)."""
        from submitit.helpers import DelayedSubmission

        record_event(self.run_dir, "requeue", **_job_fields())
        return DelayedSubmission(self, *args, **kwargs)
