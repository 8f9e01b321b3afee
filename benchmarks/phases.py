"""Where an off-policy iteration's time goes: DQN, SAC and TD3 recipes by phase, on their learning-benchmark tasks.

Each recipe runs in this process at its ``benchmarks/learning.py`` task settings (``dqn-cartpole``, ``sac-pendulum``,
``td3-pendulum``), evaluation off, updating from the 100th frame, twice: once plain, for its training time per
iteration (``summary["train_s"] / iterations``), and once under ``cProfile``, whose cumulative times are summed into
phases by the functions that make them:

* collect: ``BatchCollector.collect`` (env steps and the policy's forward);
* replay extend / replay sample: ``TransitionReplayBuffer.extend`` / ``.sample``;
* loss forward: the loss module's methods the recipe calls (``DirectDQNLoss.forward``; ``critic_loss`` and
  ``actor_loss``; ``value_loss`` and ``actor_loss``);
* backward: ``Tensor.backward``; grad norm + clip: torch's ``get_total_norm`` and ``clip_grads_with_norm_``;
* optimizer step: ``Adam.step``; target update: ``TargetUpdate.step``;
* bookkeeping: the trainer's ``record`` (counters, metrics, log rows);
* other: the rest of the training time (the loop itself, the updaters' Python, the trainer's iteration).

Each recipe runs with ``run.flush_denormal`` false (IEEE arithmetic: the "before") and true (the recipes' default:
denormal floats as zero), so the table shows what flushing denormals buys in the same run. The profiler's own cost
falls on Python calls, so the shares overstate Python-heavy phases a little; the ms column
is the share of the plain run's time per iteration. Run it when the machine is quiet::

    python benchmarks/phases.py [--recipes dqn sac td3] [--frames N] [--threads 1] [--flush-denormal both]
        [--markdown docs/throughput.md#phases]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import inspect
import io
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("WANDB_MODE", "disabled")

TASKS = {"dqn": "dqn-cartpole", "sac": "sac-pendulum", "td3": "td3-pendulum"}
# about 30 s of learning each on one core: Adam's idle moments reach denormal range after ~800 updates
FRAMES = {"dqn": 20_000, "sac": 3_000, "td3": 6_000}
LEARN_FROM = 100


def phase_functions() -> dict[str, list[Callable[..., Any]]]:
    """Each phase's functions (unwrapped to the code that runs: torch's decorators share one wrapper's code)."""
    import torch

    from tdrl.collect.collector import BatchCollector
    from tdrl.objectives.dqn import DirectDQNLoss
    from tdrl.objectives.sac import TwinQSACLoss
    from tdrl.objectives.td3 import TwinQTD3Loss
    from tdrl.objectives.update import TargetUpdate
    from tdrl.replay import TransitionReplayBuffer
    from tdrl.train.sync import SyncTrainer

    return {
        "collect": [BatchCollector.collect],
        "replay extend": [TransitionReplayBuffer.extend],
        "replay sample": [TransitionReplayBuffer.sample],
        "loss forward": [DirectDQNLoss.forward, TwinQSACLoss.critic_loss, TwinQSACLoss.actor_loss,
                         TwinQTD3Loss.value_loss, TwinQTD3Loss.actor_loss],
        "backward": [torch.Tensor.backward],
        "grad norm + clip": [torch.nn.utils.get_total_norm, torch.nn.utils.clip_grads_with_norm_],
        "optimizer step": [torch.optim.Adam.step],
        "target update": [TargetUpdate.step],
        "bookkeeping": [SyncTrainer.record],
    }


def _code_key(fn: Callable[..., Any]) -> tuple[str, int, str]:
    code = inspect.unwrap(fn).__code__
    return code.co_filename, code.co_firstlineno, code.co_name


def run_recipe(recipe: str, frames: int, threads: int, flush_denormal: bool, root: str) -> dict[str, Any]:
    from learning import TASKS as LEARNING_TASKS
    from learning import load_recipe

    from tdrl.config import apply_overrides

    task = next(t for t in LEARNING_TASKS if t.name == TASKS[recipe])
    module = load_recipe(task.recipe)
    cfg = apply_overrides(module.Config(), [
        f"env.id={task.env_id}", *task.overrides, f"collector.total_frames={frames}", f"run.root={root}",
        "eval.n_envs=0", f"optim.min_steps_learn={LEARN_FROM}", f"logger.log_interval_steps={frames}",
        "logger.wandb=false", "logger.progress_bar=false", "checkpoint.snapshot_mode=none",
        f"run.torch_threads={threads}", f"run.flush_denormal={str(flush_denormal).lower()}"])
    with contextlib.redirect_stdout(io.StringIO()):
        return module.main(cfg)


def profile(recipe: str, frames: int, threads: int, flush_denormal: bool) -> list[tuple[str, float, float]]:
    """``(phase, ms per iteration, share of the training time)`` rows, ending with ``other`` and ``total``."""
    with tempfile.TemporaryDirectory() as root:
        plain = run_recipe(recipe, frames, threads, flush_denormal, root)
    ms_per_iteration = plain["train_s"] / plain["iterations"] * 1e3
    profiler = cProfile.Profile()
    with tempfile.TemporaryDirectory() as root:
        profiler.enable()
        profiled = run_recipe(recipe, frames, threads, flush_denormal, root)
        profiler.disable()
    profiler.create_stats()  # what pstats.Stats(profiler) reads
    stats = profiler.stats  # key -> (calls, primitive calls, tottime, cumtime, callers)
    rows, total_share = [], 0.0
    for phase, functions in phase_functions().items():
        seconds = sum(stats[key][3] for key in map(_code_key, functions) if key in stats)
        share = seconds / profiled["train_s"]
        total_share += share
        rows.append((phase, share * ms_per_iteration, share))
    rows.append(("other", (1 - total_share) * ms_per_iteration, 1 - total_share))
    rows.append(("total", ms_per_iteration, 1.0))
    updates = plain["updates"] / plain["iterations"]
    print(f"\n{recipe} ({TASKS[recipe]}, flush_denormal={flush_denormal}): {plain['iterations']} iterations of "
          f"{frames // plain['iterations']} frames, {updates:.2f} updates each, {ms_per_iteration:.2f} ms "
          "per iteration (plain run)")
    return rows


def main() -> None:
    from report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--frames", type=int, default=None, help="env frames per run (default: per recipe)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the learning benchmark's SB3 uses 1)")
    parser.add_argument("--flush-denormal", choices=["both", "true", "false"], default="both",
                        help="run.flush_denormal settings to profile (default: both, false first)")
    add_markdown_option(parser)
    args = parser.parse_args()
    settings = {"both": [False, True], "true": [True], "false": [False]}[args.flush_denormal]
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.threads} torch thread(s)")
    table = {f"{recipe}{' flush' * flush}": profile(recipe, args.frames or FRAMES[recipe], args.threads, flush)
             for recipe in args.recipes for flush in settings}
    print(f"\nms per iteration by phase (share of training time); load after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| phase | " + " | ".join(table) + " |")
    print("|---|" + "---:|" * len(table))
    for i, (phase, *_) in enumerate(next(iter(table.values()))):
        cells = [f"{rows[i][1]:.3f} ({rows[i][2]:.0%})" for rows in table.values()]
        print(f"| {phase} | " + " | ".join(cells) + " |")
    if len(settings) == 2:
        speedups = [f"{table[r][-1][1] / table[f'{r} flush'][-1][1]:.2f}x" for r in args.recipes]
        print("\nflush_denormal=true speed-up per iteration: "
              + ", ".join(f"{r} {x}" for r, x in zip(args.recipes, speedups, strict=True)))


if __name__ == "__main__":
    from report import markdown_page

    with markdown_page("Phases"):  # --markdown PAGE#SECTION: into its docs section
        main()
