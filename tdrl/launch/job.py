"""A recipe run as a submitit job that requeues itself on preemption and before its time limit.

The job calls the recipe's ``main(cfg)`` in its own process, so submitit's USR2 handler lives in the process that
trains. On USR2 submitit calls :meth:`RecipeJob.checkpoint`, which requeues the same job on the same ``run.dir``;
the recipe resumes there from its last checkpoint. Rank 0 appends each start, requeue and end to
``<run dir>/launch_events.jsonl`` for ``status``; every rank of a multi-task job adds where it runs (``rank``, or
``ray_node`` in a Ray job) and any error it raised, with its rank.

``main`` runs in :func:`~tdrl.utils.console.quiet_console`, as on a recipe's command line (local sweeps run that
command line): the job's log holds tdrl's lines and the bar, not the third-party messages checked to be harmless
(``TDRL_DEBUG=1`` keeps them).
"""

from __future__ import annotations

import json
import os
import signal
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
from tdrl.utils.console import quiet_console
from tdrl.utils.errors import NothingToDo

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
    is also ``run_dir``, where events are recorded) as one SLURM job; ``ray``: on a Ray cluster over the job's
    nodes, the driver on the first (:mod:`tdrl.launch.ray_slurm`)."""

    recipe: str
    overrides: list[str]
    run_dir: str
    ray: bool = False

    def __call__(self) -> dict[str, Any] | None:
        """Run the recipe in this process and return its summary dict (submitit's job result; None on the tasks of
        a Ray job that only host Ray workers)."""
        _follow_allocation()
        rank = int(os.environ.get("SLURM_PROCID", "0"))
        if self.ray:
            return self._run_on_ray(rank)
        if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
            place = slurm_dist_env()
            export_dist_env(place)  # torchrun-style env:// variables for data-parallel trainers
            record_event(self.run_dir, "rank", rank=rank, master=f"{place.master_addr}:{place.master_port}",
                         **_job_fields())
        return self._run_recipe(rank)

    def _run_recipe(self, rank: int) -> dict[str, Any]:
        if rank == 0:
            record_event(self.run_dir, "start", **_job_fields())
        try:
            module = load_recipe(self.recipe)
            cfg = apply_overrides(module.Config(), self.overrides)
            with quiet_console():  # the job's log as quiet as a recipe's console (run_recipe does the same)
                summary = module.main(cfg)
        except NothingToDo as done:  # a requeue after the run finished: its summary is the result
            print(f"tdrl: {done}", flush=True)
            summary = json.loads((Path(self.run_dir) / "summary.json").read_text())
        except Exception as e:
            record_event(self.run_dir, "error", rank=rank, error=f"{type(e).__name__}: {e}",
                         traceback=traceback.format_exc())
            raise
        if rank == 0:
            record_event(self.run_dir, "end", **_job_fields())
        return summary

    def _run_on_ray(self, rank: int) -> dict[str, Any] | None:
        from tdrl.launch.ray_slurm import RaySetupError, ray_node

        try:
            with ray_node(self.run_dir) as place:
                record_event(self.run_dir, "ray_node", rank=rank, address=place.address, nodes=place.n_nodes,
                             **_job_fields())
                if place.is_head:
                    return self._run_recipe(rank)
            return None  # a worker node's task: the driver has ended
        except RaySetupError as e:  # names the node and its Ray log
            record_event(self.run_dir, "error", rank=rank, error=f"{type(e).__name__}: {e}", **_job_fields())
            raise

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Requeue this same job; it resumes from ``run_dir`` (called by submitit on USR2, rank 0 only)."""
        from submitit.helpers import DelayedSubmission

        record_event(self.run_dir, "requeue", **_job_fields())
        # submitit runs `scontrol requeue` next, and SLURM's requeue SIGTERMs every process of the job: scontrol too,
        # when it has not exited yet (seen on a busy node), which fails the requeue. An ignored SIGTERM is inherited
        # across exec, so scontrol lives to exit; this process exits right after it, as submitit requeues.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return DelayedSubmission(self, *args, **kwargs)
