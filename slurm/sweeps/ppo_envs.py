"""PPO across classic-control tasks, each with its own frame budget (values of one level stay tied), 2 seeds.

Levels list whole combinations, so ``env.id`` and ``collector.total_frames`` move together (rlpyt semantics);
crossing with the seeds gives 3 x 2 = 6 runs in ``runs/sweeps/ppo_envs/<env>/run_<seed>``.

    python slurm/launch.py slurm slurm/sweeps/ppo_envs.py --partition debug --time 1:00:00 --array-parallelism 4
"""

from tdrl.launch import Resources, Sweep, VariantLevel

sweep = Sweep(
    name="ppo_envs",
    recipe="recipes/ppo.py",
    levels=[
        VariantLevel(
            keys=["env.id", "collector.total_frames"],
            values=[["CartPole-v1", 100_000], ["Acrobot-v1", 300_000], ["MountainCar-v0", 500_000]],
            dir_names=["cartpole", "acrobot", "mountaincar"],
        ),
    ],
    seeds=[0, 1],
    resources=Resources(cpus_per_run=2, mem_gb=4, time_min=60, array_parallelism=4),
)
