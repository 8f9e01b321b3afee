"""Submit a sweep to SLURM as one job array through submitit (imported only here, when used).

Every run becomes a :class:`tdrl.launch.job.RecipeJob` in one array (``--array=0-N%P``); submitit's files go to
``<exp dir>/slurm/<job id>/`` and the job ids and logs to ``sweep.json``, so ``status`` follows the runs from any
shell. Jobs requeue themselves on preemption and before their time limit (USR2 ``signal_delay_s`` early, at most
``max_requeues`` time-outs) and resume from their run directory. Nothing is submitted unless every run's config
validated and the resources fit the cluster.

A run of several tasks (``nodes`` x ``tasks_per_node``) is one rank per task (``trainer.kind=ddp``, whose
``trainer.world_size`` must match) or, with ``resources.ray`` or ``trainer.kind=ray``, one Ray node per SLURM node
with the driver on the first (:mod:`tdrl.launch.ray_slurm`). srun ends every task as soon as one fails
(``--kill-on-bad-exit``), so a dead rank fails the job at once instead of leaving its peers waiting in a collective.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tdrl.config import apply_overrides
from tdrl.launch.job import RecipeJob
from tdrl.launch.local import write_root_files
from tdrl.launch.recipe import load_recipe
from tdrl.launch.status import (
    START_MARKER,
    TERMINAL,
    RunStatus,
    check_not_running,
    format_status,
    slurm_query,
    sweep_status,
)
from tdrl.launch.sweep import Resources, RunSpec, SweepError, SweepPlan
from tdrl.launch.variants import save_variant
from tdrl.utils.files import write_json_atomic

__all__ = ["SubmittedRun", "check_run_layout", "submit_sweep", "wait_for_sweep"]


@dataclass
class SubmittedRun:
    """A run and the SLURM job that runs it."""

    run: RunSpec
    job_id: str
    stdout: Path
    stderr: Path
    result: Path


def _gres_gpus(gres: str) -> int:
    """GPUs in a GRES string: ``gpu:a100:4(S:0-1),shard:8`` -> 4; ``(null)`` -> 0."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _largest_nodes() -> tuple[dict[str, tuple[int, int, int, int]], str | None]:
    """Each partition's largest ``(CPUs, memory MB, GPUs)`` per node and its node count, and the default partition
    (sinfo's ``*``).

    ``({}, None)`` when sinfo does not answer.
    """
    nodes: dict[str, tuple[int, int, int, int]] = {}
    default = None
    for line in (slurm_query("sinfo", "-h", "-o", "%P|%c|%m|%G|%D") or "").splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5 or not fields[0]:
            continue
        name, cpus, mem, gres, count = fields
        if name.endswith("*"):
            name = default = name[:-1]
        cpus_, mem_, gpus_, count_ = nodes.get(name, (0, 0, 0, 0))
        nodes[name] = (max(cpus_, int(cpus.rstrip("+") or 0)), max(mem_, int(mem.rstrip("+") or 0)),
                       max(gpus_, _gres_gpus(gres)), count_ + int(count or 0))  # one line per node state
    return nodes, default


def _check_slurm_resources(resources: Resources) -> None:
    """Fail before submitting when the request cannot run on this cluster.

    Raises:
        SweepError: a non-positive count, no SLURM client on PATH, an unknown partition (listing the known
            ones), more nodes than the partition has, more CPUs per task, memory or GPUs than its largest node has,
            or a Ray run with several tasks per node.
    """
    _check_counts(resources)
    for tool in ("sbatch", "scontrol", "squeue"):
        if shutil.which(tool) is None:
            raise SweepError(
                f"'{tool}' is not on PATH: no SLURM client here (start one: bash slurm/local-cluster.sh start)"
            )
    nodes, default = _largest_nodes()
    if resources.partition and nodes and resources.partition not in nodes:
        raise SweepError(f"unknown SLURM partition '{resources.partition}'; partitions: {', '.join(sorted(nodes))}")
    name = resources.partition or default
    if name is not None and name in nodes:
        _check_fits_partition(resources, name, nodes)


def _check_counts(r: Resources) -> None:
    """The request's own consistency: positive counts, one task per node for Ray."""
    for key in ("cpus_per_run", "time_min", "tasks_per_node", "nodes"):
        if getattr(r, key) < 1:
            raise SweepError(f"resources.{key}={getattr(r, key)}: must be at least 1")
    if r.gpus_per_run < 0 or (r.array_parallelism is not None and r.array_parallelism < 1):
        raise SweepError("resources: gpus_per_run must be >= 0 and array_parallelism >= 1")
    if r.ray and r.tasks_per_node != 1:
        raise SweepError(f"resources.ray with tasks_per_node={r.tasks_per_node}: a Ray run has one task per node "
                         "(Ray starts its own workers there); use tasks_per_node=1")


def _check_fits_partition(r: Resources, name: str, nodes: dict[str, tuple[int, int, int, int]]) -> None:
    """The request against partition ``name``'s node count and its largest node (:func:`_largest_nodes`)."""
    cpus, mem_mb, gpus, count = nodes[name]
    if count and r.nodes > count:
        wide = sorted(p for p, n in nodes.items() if n[3] >= r.nodes)
        raise SweepError(f"nodes={r.nodes} but partition '{name}' has {count} node(s); "
                         + (f"partitions with {r.nodes}: {', '.join(wide)}" if wide else "no partition has as many"))
    where = f"the largest node of partition '{name}' has"
    if cpus and r.cpus_per_run * r.tasks_per_node > cpus:
        raise SweepError(f"cpus_per_run={r.cpus_per_run} x tasks_per_node={r.tasks_per_node} but {where} {cpus} CPUs")
    if r.mem_gb and mem_mb and r.mem_gb * 1024 > mem_mb:
        raise SweepError(f"mem_gb={r.mem_gb} but {where} {mem_mb / 1024:.1f} GB")
    if r.gpus_per_run > gpus:
        raise SweepError(f"gpus_per_run={r.gpus_per_run} but {where} {gpus} GPUs")


def _make_executor(folder: Path, resources: Resources, name: str, n_runs: int):
    """A submitit SLURM executor with the sweep's resources."""
    import submitit

    r = resources
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=r.max_requeues)
    params = dict(
        name=name, timeout_min=int(r.time_min), cpus_per_task=r.cpus_per_run, tasks_per_node=r.tasks_per_node,
        nodes=r.nodes, slurm_array_parallelism=r.array_parallelism or max(1, n_runs),
        # USR2 must come while there is still time to checkpoint; never at the very start of a short job.
        slurm_signal_delay_s=int(min(r.signal_delay_s, max(10, r.time_min * 60 // 2))),
    )
    # each start says so in the job's stderr, where status looks for the rank that failed since
    setup = [f'echo "{START_MARKER} ${{SLURM_RESTART_COUNT:-0}} on $(hostname)" >&2', *r.slurm_setup]
    optional = dict(
        gpus_per_node=r.gpus_per_run, mem_gb=r.mem_gb, slurm_partition=r.partition, slurm_setup=setup,
        slurm_additional_parameters=dict(r.slurm_extra),
    )
    if r.nodes * r.tasks_per_node > 1:  # a rank that dies ends its peers at once (they would wait in a collective)
        optional["slurm_srun_args"] = ["--kill-on-bad-exit=1"]
    executor.update_parameters(**params, **{k: v for k, v in optional.items() if v})
    return executor


def _run_trainers(plan: SweepPlan) -> list[tuple[str, int] | None]:
    """Each run's ``(trainer.kind, trainer.world_size)`` (1 without ddp), or None without a ``trainer`` section."""
    module = load_recipe(plan.recipe)
    out = []
    for run in plan.runs:
        trainer = getattr(apply_overrides(module.Config(), list(run.overrides)), "trainer", None)
        out.append((trainer.kind, getattr(trainer, "world_size", 1)) if trainer is not None else None)
    return out


def check_run_layout(plan: SweepPlan, resources: Resources) -> list[bool]:
    """Which runs need a Ray cluster (``resources.ray`` or ``trainer.kind=ray``); raise before submitting when a
    data-parallel run's ``trainer.world_size`` differs from the job's ranks, or a one-process trainer would run in
    every task of a multi-task job.

    Raises:
        SweepError: naming the run, its trainer and the job's ``nodes x tasks_per_node``.
    """
    r = resources
    ranks = r.nodes * r.tasks_per_node
    ray = []
    for run, trainer in zip(plan.runs, _run_trainers(plan), strict=True):
        kind, size = trainer or (None, 0)
        if kind == "ddp" and ranks > 1 and size != ranks:
            raise SweepError(f"run '{run.name}': trainer.world_size={size} but the job starts nodes={r.nodes} x "
                             f"tasks_per_node={r.tasks_per_node} = {ranks} ranks; make them equal")
        if kind == "ray" and r.tasks_per_node != 1:
            raise SweepError(f"run '{run.name}': trainer.kind=ray runs one task per node; use tasks_per_node=1")
        if kind in ("sync", "async") and ranks > 1 and not r.ray:  # every task would train into the same run.dir
            raise SweepError(f"run '{run.name}': trainer.kind={kind} is one process, but the job starts nodes={r.nodes}"
                             f" x tasks_per_node={r.tasks_per_node} tasks; use trainer.kind=ddp "
                             f"trainer.world_size={ranks}, or one task")
        ray.append(r.ray or kind == "ray")
    return ray


def submit_sweep(
    plan: SweepPlan, resources: Resources | None = None, rerun_done: bool = False, out: IO[str] | None = None
) -> list[SubmittedRun]:
    """Submit the plan's runs (except finished ones, unless ``rerun_done``) as one job array; returns at once.

    ``resources`` overrides ``plan.sweep.resources`` (e.g. from the command line).

    Raises:
        SweepError: the resources do not fit the cluster, or runs of this sweep are still queued or running
            (checked before anything is submitted).
    """
    out = out or sys.stdout
    resources = resources or plan.sweep.resources
    _check_slurm_resources(resources)
    ray = check_run_layout(plan, resources)
    check_not_running(plan)
    todo = [r for r in plan.runs if rerun_done or not r.is_done()]
    plan.exp_dir.mkdir(parents=True, exist_ok=True)
    manifest = plan.manifest("slurm")
    manifest["resources"] = dataclasses.asdict(resources)
    submitted: list[SubmittedRun] = []
    if todo:
        for run in todo:
            save_variant(run.variant, run.run_dir)
        executor = _make_executor(plan.exp_dir / "slurm" / "%j", resources, plan.sweep.name, len(todo))
        with executor.batch():
            jobs = [executor.submit(RecipeJob(str(plan.recipe), list(r.overrides), str(r.run_dir), ray[r.index]))
                    for r in todo]
        for run, job in zip(todo, jobs, strict=True):
            sub = SubmittedRun(run, str(job.job_id), job.paths.stdout, job.paths.stderr, job.paths.result_pickle)
            submitted.append(sub)
            manifest["runs"][run.index].update(
                job_id=sub.job_id, stdout=str(sub.stdout), stderr=str(sub.stderr), result=str(sub.result)
            )
    manifest["submitted"] = time.time()
    write_json_atomic(plan.exp_dir / "sweep.json", manifest)
    write_root_files(plan, [f"SLURM jobs: {', '.join(s.job_id for s in submitted) or 'none'}"], len(submitted))
    skipped = len(plan.runs) - len(todo)
    array = submitted[0].job_id.split("_")[0] if submitted else "-"
    print(
        f"sweep '{plan.sweep.name}': submitted {len(submitted)} runs as SLURM job {array}"
        + (f" ({skipped} already done, skipped)" if skipped else "")
        + f"\n  experiment dir: {plan.exp_dir}\n  status: python slurm/launch.py status {plan.exp_dir}",
        file=out,
    )
    return submitted


def wait_for_sweep(
    exp_dir: Path, poll_s: float = 5.0, timeout_s: float | None = None, out: IO[str] | None = None
) -> list[RunStatus]:
    """Poll ``status`` until every run has ended (or ``timeout_s``); returns the final statuses.

    Raises:
        TimeoutError: runs still pending or running after ``timeout_s``, listing them.
    """
    t0 = time.monotonic()
    last = ""
    while True:
        statuses = [s for s in sweep_status(exp_dir) if s.state != "SKIPPED"]
        if all(s.state in TERMINAL for s in statuses):
            return statuses
        line = ", ".join(f"{s.name}={s.state}" for s in statuses if s.state not in TERMINAL)
        if out is not None and line != last:
            print(f"  waiting: {line}", file=out, flush=True)
            last = line
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"after {timeout_s:.0f}s still not finished: {line}\n{format_status(statuses)}")
        time.sleep(poll_s)
