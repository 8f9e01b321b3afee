"""PPO on CartPole-v1: two learning rates x two clip ranges x three seeds (12 runs).

python slurm/launch.py plan   slurm/sweeps/ppo_cartpole_lr.py     # check it, print the 12 commands
python slurm/launch.py local  slurm/sweeps/ppo_cartpole_lr.py     # on this machine, one run per core
python slurm/launch.py slurm  slurm/sweeps/ppo_cartpole_lr.py --partition debug --time 30
python slurm/launch.py status runs/sweeps/ppo_cartpole_lr --results
"""

from tdrl.launch import Resources, Sweep, VariantLevel

sweep = Sweep(
    name="ppo_cartpole_lr",
    recipe="recipes/ppo.py",
    levels=[
        VariantLevel(keys=["optim.lr"], values=[[3e-4], [1e-3]], dir_names=["lr3e-4", "lr1e-3"]),
        VariantLevel(
            keys=["loss.clip_epsilon"], values=[[0.1], [0.2]], dir_names=["clip0.1", "clip0.2"]
        ),
    ],
    seeds=[0, 1, 2],
    overrides={"env.id": "CartPole-v1", "collector.total_frames": 100_000},
    resources=Resources(cpus_per_run=1, mem_gb=4, time_min=30),
)
