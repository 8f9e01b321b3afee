"""VMAS throughput: tdrl's ``batched_env`` collector kind against TorchRL's ``Collector`` (its SyncDataCollector)
over the same VMAS scenario, with the same policy module, both measured in one run.

Rows, per number of envs ``N`` (``--envs``; BenchMARL's on-policy VMAS tasks use 600 envs x 100 steps a batch):

* ``tdrl batched_env`` — ``make_collector("batched_env", EnvFactory("vmas/<scenario>"), policy, batch_B=N,
  batch_T=T)``: one ``VmasWrapper`` stepped in this process, batches in tdrl's grouped layout (TrajInfos included).
* ``torchrl Collector`` — ``torchrl.collectors.Collector(VmasEnv(<scenario>, num_envs=N, max_steps=100), policy,
  frames_per_batch=N * T)``, the collector BenchMARL runs VMAS with.

The policy is recipes/mappo.py's actor for the group (a ``MultiAgentMLP``, 2x64 tanh, shared by the agents, to a
TanhNormal with log-probabilities), the same module object in both rows, acting deterministically by default (its
mean): both envs are seeded alike, so both rows play the same episodes (VMAS's step time depends on the state, its
contacts); ``--exploration random`` samples. VMAS on the CPU. A frame is one
env step (all agents), as both collectors count them. Each row: a warm-up batch, then ``--repeats`` timed runs of
at least ``--seconds``, round-robin over the rows of an ``N`` (load drifts hit both), median reported, with frames per
CPU-second (load-independent). Torch runs with one thread.

Usage::

    python benchmarks/batched_env.py [--scenario balance] [--envs 60 600] [--batch-T 100] [--seconds 4]
        [--markdown docs/throughput.md#vmas-collection]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from collectors import Row, measure_interleaved

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
SEED = 0


def make_policy(scenario: str):
    """recipes/mappo.py's actor for the scenario's one group ``agent`` (tdrl's prefix group map)."""
    from tdrl.envs import EnvFactory
    from tdrl.launch.recipe import load_recipe

    mappo = load_recipe(RECIPES / "mappo.py")
    specs = EnvFactory(f"vmas/{scenario}").specs()
    (group,) = specs.observation_spec.keys()
    torch.manual_seed(0)
    actor = mappo.group_actor(group, specs.observation_spec[group, "observation"],
                              specs.action_spec[group, "action"], mappo.ModelConfig(), masked=False)
    return group, actor


def tdrl_row(scenario: str, policy, n_envs: int, batch_T: int, exploration: str) -> Row:
    from tdrl.collect import make_collector
    from tdrl.envs import EnvFactory

    collector = make_collector("batched_env", EnvFactory(f"vmas/{scenario}"), policy, batch_B=n_envs,
                               batch_T=batch_T, seed=SEED, exploration_type=exploration)
    return Row("tdrl batched_env", "vmas", collector.collect, n_envs * batch_T, collector.shutdown)


def torchrl_row(scenario: str, group: str, policy, n_envs: int, batch_T: int, exploration: str) -> Row:
    """TorchRL's collector on a VmasEnv seeded as tdrl seeds its env, so a deterministic policy plays the same
    episodes in both rows (VMAS's step time depends on the state: contacts)."""
    from tensordict.nn import InteractionType
    from torchrl.collectors import Collector
    from torchrl.envs.libs.vmas import VmasEnv

    from tdrl.collect.stepping import env_seed

    env = VmasEnv(scenario, num_envs=n_envs, max_steps=100, seed=0)
    env = VmasEnv(scenario, num_envs=n_envs, max_steps=100, seed=0, group_map={group: env.agent_names})
    env.set_seed(env_seed(SEED, 0))
    collector = Collector(env, policy, frames_per_batch=n_envs * batch_T, total_frames=-1,
                          exploration_type=InteractionType.from_str(exploration), auto_register_policy_transforms=False)
    batches = iter(collector)
    return Row("torchrl Collector", "vmas", lambda: next(batches), n_envs * batch_T, collector.shutdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="balance")
    parser.add_argument("--envs", type=int, nargs="+", default=[60, 600], help="numbers of envs N")
    parser.add_argument("--batch-T", type=int, default=100, help="steps per batch")
    parser.add_argument("--seconds", type=float, default=4.0, help="least seconds per timed run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--exploration", default="deterministic", choices=["deterministic", "random"],
                        help="deterministic: the policy's mean, so both rows play the same episodes")
    from report import add_markdown_option

    add_markdown_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    group, policy = make_policy(args.scenario)
    print(f"vmas/{args.scenario}, T={args.batch_T}, policy: recipes/mappo.py's actor (2x64 tanh, TanhNormal), "
          f"{args.exploration}; torch {torch.__version__}, 1 thread", flush=True)
    print("| N | collector | frames/s | frames per CPU-s | ratio tdrl / torchrl |\n|---|---|---|---|---|")
    for n in args.envs:
        rows = [tdrl_row(args.scenario, policy, n, args.batch_T, args.exploration),
                torchrl_row(args.scenario, group, policy, n, args.batch_T, args.exploration)]
        try:
            measure_interleaved(rows, args.seconds, args.repeats)
        finally:
            for row in rows:
                row.close()
        fps = [statistics.median(row.rates) for row in rows]
        cpu = [statistics.median(row.cpu_rates) for row in rows]
        for row, rate, per_cpu in zip(rows, fps, cpu, strict=True):
            ratio = f"{fps[0] / fps[1]:.2f}x" if row is rows[0] else ""
            print(f"| {n} | {row.name} | {rate:,.0f} | {per_cpu:,.0f} | {ratio} |", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    from report import markdown_page

    with markdown_page("VMAS collection"):  # --markdown PAGE#SECTION: into its docs section
        main()
