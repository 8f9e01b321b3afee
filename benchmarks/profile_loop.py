"""Profile a recipe's training loop with torch.profiler: GPU busy time and host time per update, and the host ops.

The GPU check's rows (``benchmarks/gpu_updates.py``) say how fast a loop runs; this says why: whether the device
or the host is the limit, and which host calls the time goes to. It runs the recipe in this process with its own
command-line arguments and steps a profiler schedule at each ``trainer.record`` (one per iteration): ``--skip``
iterations after learning starts (warm-up, compilation, graph capture), then ``--active`` iterations profiled.
The run stops right after them. Printed:

* wall time per update over the profiled iterations (the profiler's own cost included: an upper bound);
* GPU busy time per update: the summed durations of every kernel and copy the device ran (graph-replayed kernels
  included), and their number per update; busy near wall means device-bound, far below means host-bound;
* the host ops with the most self time per update.

Usage (recipe arguments after ``--``)::

    python benchmarks/profile_loop.py sac --skip 50 --active 300 -- run.device=cuda optim.cudagraphs=true
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOP_OPS = 14


class Stop(Exception):
    """Raised from the recording hook once the profiled iterations are done: the run needs to go no further."""


def profile(recipe: str, argv: list[str], skip: int, active: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity

    from tdrl.train.core import TrainerCore
    from tdrl.utils.dotted_config import parse_args
    from tdrl.utils.scripts import load_module

    module = load_module(f"recipe_{recipe}", ROOT / "recipes" / f"{recipe}.py")
    with tempfile.TemporaryDirectory(prefix="tdrl-profile-") as run_dir:
        cfg = parse_args(module.Config(), [*argv, f"run.dir={run_dir}", "logger.wandb=false",
                                           "logger.progress_bar=false"], f"recipes/{recipe}.py", "")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        state: dict[str, float] = {"learning": 0, "updates": 0, "start": 0.0, "wall": 0.0}
        prof = torch.profiler.profile(activities=activities,
                                      schedule=torch.profiler.schedule(wait=skip, warmup=1, active=active))
        record = TrainerCore.record

        def recording(trainer: TrainerCore, metrics: Any = None, *, updates: int = 0) -> None:
            record(trainer, metrics, updates=updates)
            if not updates and not state["learning"]:
                return  # before learning starts: nothing to profile yet
            state["learning"] += 1
            n = state["learning"]
            if n >= skip + 2:  # an iteration that ran inside the profiled window
                state["updates"] += updates
            if n == skip + 1 + active:  # the last one: the wall time ends when the device is done
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                state["wall"] = time.perf_counter() - state["start"]
            prof.step()
            if n == skip + 1:  # the profiled iterations start now (after wait and warm-up)
                state["start"] = time.perf_counter()
            elif n == skip + 1 + active:
                raise Stop

        TrainerCore.record = recording  # type: ignore[method-assign,assignment]  # a benchmark's hook, restored below
        try:
            with prof:
                module.main(cfg)
        except Stop:
            pass
        finally:
            TrainerCore.record = record  # type: ignore[method-assign]
    report(prof, int(state["updates"]), state["wall"], recipe, argv)


def report(prof: Any, updates: int, wall: float, recipe: str, argv: list[str]) -> None:
    """Print the per-update figures of the profiled iterations."""
    events = prof.key_averages()
    # the device's own events (kernels, copies): a host op's device time repeats its kernels', and the profiler
    # step's repeats those of the CUDA graph it launched
    device = [e for e in events if str(e.device_type).endswith("CUDA") and not e.key.startswith("ProfilerStep")]
    busy_us = sum(e.self_device_time_total for e in device)
    kernels = sum(e.count for e in device)
    n = max(updates, 1)
    print(f"\n{recipe} {' '.join(argv)}: {updates} updates profiled\n")
    print("| per update | value |\n|---|---:|")
    print(f"| wall time, profiler included (us) | {1e6 * wall / n:,.0f} |")
    print(f"| GPU busy: kernels and copies (us) | {busy_us / n:,.0f} |")
    print(f"| kernels and copies run | {kernels / n:,.1f} |")
    print("\nHost ops with the most self time (us per update; count per update):\n")
    print("| op | us | count |\n|---|---:|---:|")
    for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:TOP_OPS]:
        print(f"| {e.key[:70]} | {e.self_cpu_time_total / n:,.1f} | {e.count / n:,.2f} |")
    if device:
        print("\nDevice work with the most time (us per update):\n\n| kernel or copy | us | count |\n|---|---:|---:|")
        for e in sorted(device, key=lambda e: e.self_device_time_total, reverse=True)[:TOP_OPS]:
            print(f"| {e.key[:70]} | {e.self_device_time_total / n:,.1f} | {e.count / n:,.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="a recipe in recipes/ (dqn, sac, ...)")
    parser.add_argument("--skip", type=int, default=50, help="iterations after learning starts before profiling")
    parser.add_argument("--active", type=int, default=200, help="iterations profiled")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)  # the recipe's own arguments follow --
    args = parser.parse_args(argv[:split])
    profile(args.recipe, argv[split + 1:], args.skip, args.active)


if __name__ == "__main__":
    main()
