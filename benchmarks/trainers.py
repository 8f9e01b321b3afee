"""Throughput of the multi-process trainers against the sync trainer, every row measured in the same invocation.

Section 1 -- async vs sync, one off-policy loop (DQN on CartPole-v1, serial collector ``B x T`` frames per
iteration, ``replay_ratio`` and ``batch_size`` fixed) run by ``make_trainer`` with ``trainer.kind`` = ``sync`` or
``async`` -- the same code path a recipe takes -- on the same frame budget:

* ``sync``: collect a batch, then its updates (rlpyt MinibatchRl);
* ``async-free``: collector process at full speed, optimizer throttled to never exceed the ratio (rlpyt AsyncRl);
* ``async-lag``: the default async trainer: the collector gathers batch k+1 while the optimizer trains on batch k
  and waits when the optimizer owes more than that, so the achieved replay ratio equals the sync trainer's (same
  learning per frame).

Columns: env frames per second of training wall time (``train_s``: startup and evaluation excluded), gradient
updates per second, the achieved replay ratio (samples drawn / frames since learning started), and each row's
frames/s and updates/s over the sync row's.

Section 2 -- data-parallel weak scaling on CPU: PPO on CartPole-v1, each rank ``B x T`` frames per iteration and
the same epochs/minibatches, ``world_size`` 1 vs 2 (gloo, spawned ranks). Columns: total frames/s over all ranks,
updates/s (each update averages one minibatch per rank), and the 2-rank/1-rank ratio (ideal 2.0 when each rank has
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
import time

import torch


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- section 1: one off-policy loop, three trainers ---------------------------------------------------------------


def dqn_run(kind: str, *, n_steps: int, batch_B: int, batch_T: int, replay_ratio: float, batch_size: int,
            min_steps_learn: int, max_lag_frames: int, hidden: int, seed: int = 0) -> dict:
    """One DQN run with ``trainer.kind=kind``; returns the trainer's summary (frames, train_s, updates, ratio)."""
    from tensordict.nn import TensorDictSequential

    from tdrl.collect import make_collector
    from tdrl.envs import EnvFactory
    from tdrl.models.exploration import EpsilonGreedy
    from tdrl.models.q import make_q_actor
    from tdrl.objectives.dqn import make_dqn_loss
    from tdrl.objectives.update import TargetUpdate, Updater
    from tdrl.replay import TransitionReplayBuffer
    from tdrl.train import TrainerConfig, make_trainer
    from tdrl.utils.seeding import seed_everything

    torch.set_num_threads(1)
    seed_everything(seed)
    env = EnvFactory("CartPole-v1")
    specs = env.specs()
    q = make_q_actor(specs, hidden_sizes=(hidden, hidden))
    policy = TensorDictSequential(q, EpsilonGreedy(specs.n_actions, eps_init=1.0, eps_final=0.05,
                                                   start_frames=min_steps_learn, end_frames=n_steps // 2))
    loss = make_dqn_loss(q)
    updater = Updater(torch.optim.Adam(loss.parameters(), lr=5e-4), loss_keys=("loss",),
                      target_update=TargetUpdate(loss, interval=200))
    with tempfile.TemporaryDirectory(prefix="tdrl-bench-replay-") as scratch:
        replay = TransitionReplayBuffer(scratch, 100_000, seed=seed)
        factory = functools.partial(make_collector, "serial", env, policy, batch_B=batch_B, batch_T=batch_T, seed=seed)
        cfg = TrainerConfig(kind=kind, max_lag_frames=max_lag_frames)
        trainer = make_trainer(cfg, on_policy=False, collector=factory() if kind == "sync" else None,
                               collector_factory=factory, replay=replay, policy=policy, seed=seed, n_steps=n_steps,
                               log_interval_steps=n_steps // 4, replay_ratio=replay_ratio, batch_size=batch_size,
                               min_steps_learn=min_steps_learn)
        for batch in trainer:
            if batch is not None:
                replay.extend(batch)
                policy[1].set_frames(trainer.frames)
            metrics = [updater.step(loss(replay.sample(batch_size))) for _ in range(trainer.updates_due)]
            trainer.record(metrics, updates=len(metrics))
        summary = trainer.summary
        samples, writes = replay.samples_drawn, replay.write_count
    learn_start = min_steps_learn // (batch_B * batch_T) * (batch_B * batch_T)
    summary["achieved_ratio"] = samples / max(writes - learn_start, 1)
    return summary


# --- section 2: data-parallel weak scaling ---------------------------------------------------------------------------


def ppo_rank(n_steps: int, batch_B: int, batch_T: int, epochs: int, minibatches: int, hidden: int) -> dict:
    """One rank of a PPO run with DataParallelTrainer (the same body on every rank)."""
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    from tdrl.collect import make_collector
    from tdrl.envs import EnvFactory
    from tdrl.models import make_actor_critic
    from tdrl.objectives.update import Updater
    from tdrl.train import DataParallelTrainer
    from tdrl.utils.distributed import rank_seed
    from tdrl.utils.seeding import seed_everything

    torch.set_num_threads(1)
    seed = rank_seed(0)
    seed_everything(seed)
    env = EnvFactory("CartPole-v1")
    ac = make_actor_critic(env.specs(), hidden_sizes=(hidden, hidden))
    collector = make_collector("serial", env, ac.actor, batch_B=batch_B, batch_T=batch_T, seed=seed)
    loss = ClipPPOLoss(ac.actor, ac.critic)
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=ac.critic, deactivate_vmap=True)
    updater = Updater(torch.optim.Adam(loss.parameters(), lr=3e-4), max_grad_norm=0.5)
    trainer = DataParallelTrainer(collector=collector, modules=[loss], n_steps=n_steps, log_interval_steps=n_steps)
    for batch in trainer:
        with torch.no_grad():
            gae(batch)
        metrics = []
        flat = batch.reshape(-1)
        for _ in range(epochs):
            for idx in torch.randperm(flat.shape[0]).chunk(minibatches):
                metrics.append(updater.step(loss(flat[idx])))
        trainer.record(metrics, updates=len(metrics))
    return trainer.summary


def ddp_run(world_size: int, **kwargs) -> dict:
    from tdrl.train import launch_data_parallel

    return launch_data_parallel(ppo_rank, world_size=world_size, **kwargs)


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small budgets (smoke test of the script)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sections", nargs="+", default=["async", "ddp"], choices=["async", "ddp"])
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args(argv)
    out: dict = {"load_before": load(), "cpus": os.cpu_count()}
    print(f"load average before: {out['load_before']}  (cpus: {out['cpus']})", flush=True)

    if "async" in args.sections:
        n_steps = 8_192 if args.quick else 40_960
        dqn = dict(n_steps=n_steps, batch_B=8, batch_T=32, replay_ratio=8.0, batch_size=128,
                   min_steps_learn=2_048, hidden=64)
        print(f"\nasync vs sync: DQN CartPole-v1, {n_steps} frames, B x T = 8 x 32, replay_ratio 8, batch 128",
              flush=True)
        rows = [
            median_row("sync", functools.partial(dqn_run, "sync", max_lag_frames=-1, **dqn), args.repeats),
            median_row("async-free", functools.partial(dqn_run, "async", max_lag_frames=-1, **dqn), args.repeats),
            median_row("async-lag", functools.partial(dqn_run, "async", max_lag_frames=0, **dqn), args.repeats),
        ]
        print_table("async vs sync (same loop, same budget; medians)", rows, "sync")
        out["async"] = rows

    if "ddp" in args.sections:
        per_rank_itrs = 6 if args.quick else 30
        ppo = dict(batch_B=8, batch_T=64, epochs=4, minibatches=4, hidden=64)
        print(f"\ndata-parallel weak scaling: PPO CartPole-v1, per rank B x T = 8 x 64, {per_rank_itrs} iterations",
              flush=True)
        rows = [median_row(f"ddp-{w}", functools.partial(ddp_run, w, n_steps=w * 512 * per_rank_itrs, **ppo),
                           args.repeats) for w in (1, 2)]
        print_table("data-parallel scaling on CPU (gloo; medians)", rows, "ddp-1")
        out["ddp"] = rows

    out["load_after"] = load()
    print(f"\nload average after: {out['load_after']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
