"""Throughput of the multi-process trainers against the sync trainer, every row measured in the same invocation.

Section 1 -- async vs sync on one recipe: ``recipes/dqn.py`` (CartPole-v1, serial collector, ``B x T`` frames per
iteration, ``replay_ratio`` and ``batch_size`` fixed, no evaluation) with ``trainer.kind`` = ``sync`` or ``async``
on the same frame budget:

* ``sync``: collect a batch, then its updates (rlpyt MinibatchRl);
* ``async-free``: collector process at full speed, optimizer throttled to never exceed the ratio (rlpyt AsyncRl);
* ``async-lag``: the default async trainer: the collector gathers batch k+1 while the optimizer trains on batch k
  and waits when the optimizer owes more than that, so the achieved replay ratio equals the sync trainer's (same
  learning per frame).

Columns: env frames per second of training wall time (``train_s``: startup and evaluation excluded), gradient
updates per second, the achieved replay ratio (samples drawn / frames since learning started), and each row's
frames/s and updates/s over the sync row's.

Section 2 -- data-parallel weak scaling on CPU: ``recipes/ppo.py trainer.kind=ddp`` on CartPole-v1, each rank
``B x T`` frames per iteration and the same epochs/minibatches, ``world_size`` 1 vs 2 (gloo, spawned ranks).
Columns: total frames/s over all ranks, updates/s (each update averages one minibatch per rank), and the
2-rank/1-rank ratio (ideal 2.0 when each rank has
a free core).

Each row is run ``--repeats`` times and the median is reported; ``uptime`` load is printed before and after
(the machine is shared: compare ratios within one invocation). Run from a temporary directory::

    cd $(mktemp -d) && python /path/to/benchmarks/trainers.py [--quick] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
from typing import Any


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- the recipes, run through their main() as from the command line -----------------------------------------------

RECIPES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "recipes")


def recipe_run(name: str, overrides: list[str]) -> dict:
    """``python recipes/<name>.py <overrides>`` in this process (its ranks/collector process are spawned); the
    recipe's summary (frames, train_s, updates, ...)."""
    from tdrl.config import apply_overrides
    from tdrl.launch.recipe import load_recipe

    module = load_recipe(os.path.join(RECIPES, f"{name}.py"))
    with tempfile.TemporaryDirectory(prefix=f"tdrl-bench-{name}-") as tmp:
        common = [f"run.dir={tmp}/run", "logger.wandb=false", "logger.progress_bar=false", "eval.n_envs=0"]
        return module.main(apply_overrides(module.Config(), [*common, *overrides]))


def dqn_run(kind: str, *, max_lag_frames: int, n_steps: int, batch_B: int, batch_T: int, replay_ratio: float,
            batch_size: int, min_steps_learn: int) -> dict:
    """recipes/dqn.py with ``trainer.kind=kind``; adds the achieved replay ratio (samples / frames after learning
    starts)."""
    summary = recipe_run("dqn", [
        f"trainer.kind={kind}", f"trainer.max_lag_frames={max_lag_frames}", f"collector.total_frames={n_steps}",
        f"collector.batch_B={batch_B}", f"collector.batch_T={batch_T}", f"optim.replay_ratio={replay_ratio}",
        f"optim.batch_size={batch_size}", f"optim.min_steps_learn={min_steps_learn}",
        f"logger.log_interval_steps={n_steps // 4}",
    ])
    learn_start = min_steps_learn // (batch_B * batch_T) * (batch_B * batch_T)
    summary["achieved_ratio"] = summary["updates"] * batch_size / max(summary["frames"] - learn_start, 1)
    return summary


def ppo_run(world_size: int, *, per_rank_itrs: int, batch_B: int, batch_T: int, epochs: int, minibatches: int) -> dict:
    """recipes/ppo.py with ``trainer.kind=ddp trainer.world_size=world_size`` (weak scaling: per-rank batches)."""
    n_steps = world_size * batch_B * batch_T * per_rank_itrs
    return recipe_run("ppo", [
        "trainer.kind=ddp", f"trainer.world_size={world_size}", f"collector.total_frames={n_steps}",
        f"collector.batch_B={batch_B}", f"collector.batch_T={batch_T}", f"loss.epochs={epochs}",
        f"loss.minibatches={minibatches}", f"logger.log_interval_steps={n_steps}",
    ])


# --- driver ---------------------------------------------------------------------------------------------------------


def median_row(name: str, fn, repeats: int) -> dict:
    runs = [fn() for _ in range(repeats)]
    fps = [r["frames"] / r["train_s"] for r in runs]
    ups = [r["updates"] / r["train_s"] for r in runs]
    row = {"name": name, "frames": runs[0]["frames"], "frames_per_s": statistics.median(fps),
           "updates_per_s": statistics.median(ups), "runs_frames_per_s": [round(x, 1) for x in fps]}
    if "achieved_ratio" in runs[0]:
        row["replay_ratio"] = statistics.median(r["achieved_ratio"] for r in runs)
    print(f"  {name:<14} frames/s {row['frames_per_s']:>9,.0f}   updates/s {row['updates_per_s']:>7,.1f}"
          + (f"   replay ratio {row['replay_ratio']:.2f}" if "replay_ratio" in row else "")
          + f"   (runs: {row['runs_frames_per_s']})", flush=True)
    return row


def print_table(title: str, rows: list[dict], base: str) -> None:
    ref = next(r for r in rows if r["name"] == base)
    print(f"\n{title}")
    print(f"| trainer | frames/s | updates/s | replay ratio | frames/s vs {base} | updates/s vs {base} |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['replay_ratio']:.2f}" if "replay_ratio" in r else "-"
        print(f"| {r['name']} | {r['frames_per_s']:,.0f} | {r['updates_per_s']:,.1f} | {ratio} | "
              f"{r['frames_per_s'] / ref['frames_per_s']:.2f} | {r['updates_per_s'] / ref['updates_per_s']:.2f} |")


def main(argv: list[str] | None = None) -> dict:
    from report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_markdown_option(parser)
    parser.add_argument("--quick", action="store_true", help="small budgets (smoke test of the script)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sections", nargs="+", default=["async", "ddp"], choices=["async", "ddp"])
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args(argv)
    out: dict = {"load_before": load(), "cpus": os.cpu_count()}
    print(f"load average before: {out['load_before']}  (cpus: {out['cpus']})", flush=True)

    if "async" in args.sections:
        n_steps = 8_192 if args.quick else 32_768
        out["async"] = {}
        # r=2: collecting a batch costs about as much as its updates; r=8: the updates dominate
        for replay_ratio in (2.0, 8.0):
            dqn: dict[str, Any] = dict(n_steps=n_steps, batch_B=8, batch_T=32, replay_ratio=replay_ratio,
                                       batch_size=128, min_steps_learn=2_048)
            print(f"\nasync vs sync: recipes/dqn.py on CartPole-v1, {n_steps} frames, B x T = 8 x 32, replay_ratio "
                  f"{replay_ratio:g}, batch 128", flush=True)
            rows = [
                median_row("sync", functools.partial(dqn_run, "sync", max_lag_frames=-1, **dqn), args.repeats),
                median_row("async-free", functools.partial(dqn_run, "async", max_lag_frames=-1, **dqn),
                           args.repeats),
                median_row("async", functools.partial(dqn_run, "async", max_lag_frames=0, **dqn), args.repeats),
            ]
            print_table(f"async vs sync, replay_ratio {replay_ratio:g} (same recipe, same budget; medians)", rows,
                        "sync")
            out["async"][f"replay_ratio_{replay_ratio:g}"] = rows

    if "ddp" in args.sections:
        ppo = dict(per_rank_itrs=6 if args.quick else 24, batch_B=8, batch_T=64, epochs=4, minibatches=4)
        print(f"\ndata-parallel weak scaling: recipes/ppo.py on CartPole-v1, per rank B x T = 8 x 64, "
              f"{ppo['per_rank_itrs']} iterations", flush=True)
        rows = [median_row(f"ddp-{w}", functools.partial(ppo_run, w, **ppo), args.repeats) for w in (1, 2)]
        print_table("data-parallel scaling on CPU (gloo; medians)", rows, "ddp-1")
        out["ddp"] = rows

    out["load_after"] = load()
    print(f"\nload average after: {out['load_after']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    from report import markdown_page

    with markdown_page("Trainers"):  # --markdown PAGE#SECTION: into its docs section
        ok = main()
    sys.exit(0 if ok else 1)
