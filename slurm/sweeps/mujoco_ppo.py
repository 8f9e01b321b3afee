"""PPO on HalfCheetah-v5 and Hopper-v5, 1M frames, tdrl beside Stable-Baselines3, 3 seeds (12 runs).

Each run is one row of benchmarks/learning.py (benchmarks/learning_run.py): tdrl's recipe with RL-Zoo's MuJoCo PPO
hyperparameters (observations normalised in the model, rewards scaled) or SB3 with RL-Zoo's (VecNormalize), one
torch thread, evaluated on the same 5 episodes every 25k frames. Seeds outer: matched tdrl/SB3 pairs finish first.
Stopping and relaunching resumes every run where it was.

python slurm/launch.py local  slurm/sweeps/mujoco_ppo.py
python benchmarks/learning.py --runs runs/sweeps/mujoco_ppo --plots docs/learning-mujoco-<date>
"""

from tdrl.launch import Resources, Sweep, VariantLevel

sweep = Sweep(
    name="mujoco_ppo",
    recipe="benchmarks/learning_run.py",
    levels=[
        VariantLevel(keys=["task"], values=[["ppo-halfcheetah"], ["ppo-hopper"]],
                     dir_names=["ppo-halfcheetah", "ppo-hopper"]),
        VariantLevel(keys=["impl"], values=[["tdrl"], ["sb3"]], dir_names=["tdrl", "sb3"]),
    ],
    seeds=[0, 1, 2],
    resources=Resources(cpus_per_run=1, mem_gb=4, time_min=240),
)
