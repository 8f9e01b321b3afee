"""Sweeps from the command line (slurm/launch.py, or tdrl sweep): plan, run locally, submit to SLURM, status.

Every command validates the whole sweep first (recipe, every run's config, slots or SLURM resources), so a
typo fails in a second, naming the key, with nothing launched. Exit codes: 0 ok, 1 some run failed,
2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import sys
from pathlib import Path

from tdrl.config import ConfigError
from tdrl.launch.recipe import RecipeError
from tdrl.launch.slots import SlotError, make_slots
from tdrl.launch.sweep import Resources, SweepError, SweepPlan, load_sweep, plan_sweep

__all__ = ["main"]


def _parse_time_min(text: str) -> int:
    """SLURM's time formats in minutes, seconds rounded up: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"time {text!r}: use minutes or [D-]HH:MM:SS")
    parts = [int(p) for p in m.group(2).split(":")]
    if m.group(1) is not None:  # D-H[:M[:S]]
        parts += [0] * (3 - len(parts))
    elif len(parts) < 3:  # M or M:S
        parts = [0, *parts, 0][:3]
    hours, minutes, seconds = parts
    return int(m.group(1) or 0) * 1440 + hours * 60 + minutes + (1 if seconds else 0)


def _plan(args: argparse.Namespace) -> SweepPlan:
    return plan_sweep(load_sweep(args.sweep), root=args.root)


def _resources(args: argparse.Namespace, base: Resources) -> Resources:
    """``base`` with the resource flags given on the command line (their ``dest`` is the field name)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(base) if getattr(args, f.name, None) is not None}
    return dataclasses.replace(base, **given)


def cmd_plan(args: argparse.Namespace) -> int:
    plan = _plan(args)
    print(f"sweep '{plan.sweep.name}': recipe {plan.recipe}\n  {len(plan.runs)} runs in {plan.exp_dir}")
    for run in plan.runs:
        done = "  (done)" if run.is_done() else ""
        print(f"  {run.name}{done}\n    {' '.join(run.command(plan.recipe, 'python'))}")
    return 0


def cmd_local(args: argparse.Namespace) -> int:
    from tdrl.launch.local import launch_local

    plan = _plan(args)
    r = _resources(args, plan.sweep.resources)
    slots = make_slots(
        cpus_per_run=r.cpus_per_run, gpus_per_run=r.gpus_per_run, runs_per_gpu=r.runs_per_gpu,
        max_slots=args.max_parallel,
    )
    outcomes = launch_local(plan, slots, rerun_done=args.rerun_done)
    return 1 if any(o.state == "failed" for o in outcomes) else 0


def cmd_slurm(args: argparse.Namespace) -> int:
    from tdrl.launch.status import format_status
    from tdrl.launch.submit import submit_sweep, wait_for_sweep

    plan = _plan(args)
    resources = _resources(args, plan.sweep.resources)
    submit_sweep(plan, resources, rerun_done=args.rerun_done)
    if not args.wait:
        return 0
    statuses = wait_for_sweep(plan.exp_dir, poll_s=args.poll, out=sys.stdout)
    print(format_status(statuses))
    return 0 if all(s.state in ("COMPLETED", "SKIPPED") for s in statuses) else 1


def cmd_status(args: argparse.Namespace) -> int:
    from tdrl.launch.status import collect_results, format_status, sweep_status

    columns = [c for c in args.columns.split(",") if c] if args.columns else None
    statuses = sweep_status(args.exp_dir)
    print(format_status(statuses, columns), flush=True)
    if args.results:
        finished = sum(row["state"] == "COMPLETED" for row in collect_results(args.exp_dir))
        print(f"results of {finished} finished runs: {Path(args.exp_dir) / 'results.csv'}")
    return 1 if any(s.state == "FAILED" for s in statuses) else 0


def build_parser(prog: str = "slurm/launch.py") -> argparse.ArgumentParser:
    """The argument parser (subcommands plan, local, slurm, status)."""
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)

    def sweep_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("sweep", help="sweep file (defines sweep = Sweep(...))")
        q.add_argument("--root", help="parent of the experiment directory (default: the sweep's root)")

    q = sub.add_parser("plan", help="validate a sweep and print its runs and their commands (launches nothing)")
    sweep_args(q)
    q.set_defaults(func=cmd_plan)

    q = sub.add_parser("local", help="run a sweep here, queued over slots of the cores it may use (taskset -c 0-7 ...)")
    sweep_args(q)
    q.add_argument("--cpus-per-run", type=int, help="cores per run (slot size)")
    q.add_argument("--gpus-per-run", type=int, help="GPUs per run")
    q.add_argument("--runs-per-gpu", type=int, help="runs sharing one GPU")
    q.add_argument("--max-parallel", type=int, help="at most this many runs at once")
    q.add_argument("--rerun-done", action="store_true", help="also run those with a summary.json")
    q.set_defaults(func=cmd_local)

    q = sub.add_parser("slurm", help="submit a sweep to SLURM as one job array (returns at once unless --wait)")
    sweep_args(q)
    q.add_argument("--partition", help="SLURM partition")
    q.add_argument("--time", dest="time_min", type=_parse_time_min, help="time limit: minutes or [D-]HH:MM:SS")
    q.add_argument("--cpus", dest="cpus_per_run", type=int, help="CPUs per run (per task)")
    q.add_argument("--gpus", dest="gpus_per_run", type=int, help="GPUs per run (per node)")
    q.add_argument("--mem", dest="mem_gb", type=float, help="memory per run in GB")
    q.add_argument("--array-parallelism", type=int, help="at most this many runs at once")
    q.add_argument("--tasks-per-node", type=int, help="processes per run (data-parallel ranks)")
    q.add_argument("--nodes", type=int, help="nodes per run")
    q.add_argument("--ray", action="store_const", const=True, help="a Ray cluster over each run's nodes, the driver "
                   "on the first (RAY_ADDRESS set; on by itself for trainer.kind=ray)")
    q.add_argument("--max-requeues", type=int, help="requeues after time-outs before giving up")
    q.add_argument("--signal-delay", dest="signal_delay_s", type=int, help="seconds before the time limit USR2 comes")
    q.add_argument("--rerun-done", action="store_true", help="also submit runs with a summary.json")
    q.add_argument("--wait", action="store_true", help="wait for every run to end and print the status")
    q.add_argument("--poll", type=float, default=10.0, help="seconds between status polls with --wait")
    q.set_defaults(func=cmd_slurm)

    q = sub.add_parser("status", help="each run's state and last progress row; --results collects summaries")
    q.add_argument("exp_dir", help="experiment directory (holds sweep.json)")
    q.add_argument("--columns", help="progress.csv columns of the last row to show, comma-separated, or 'all'")
    q.add_argument("--results", action="store_true", help="write results.csv/json of the runs' summaries")
    q.set_defaults(func=cmd_status)
    return p


def main(argv: list[str] | None = None, prog: str = "slurm/launch.py") -> int:
    """Entry point; returns the exit code (0 ok, 1 a run failed, 2 bad input)."""
    args = build_parser(prog).parse_args(argv)
    try:
        return args.func(args)
    except (SweepError, SlotError, RecipeError, ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the local launcher raises it the same way)
        again = shlex.join(["python", prog, *(sys.argv[1:] if argv is None else argv)])
        print(f"error: interrupted; the runs it started are stopped and keep their checkpoints; resume with: {again}",
              file=sys.stderr)
        return 130
