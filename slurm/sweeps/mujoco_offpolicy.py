"""SAC and TD3 on HalfCheetah-v5 and Hopper-v5, 200k frames, tdrl beside Stable-Baselines3, 2 seeds (16 runs).

Each run is one row of benchmarks/learning.py (benchmarks/learning_run.py): tdrl's recipe with its MuJoCo settings,
or SB3 with RL-Zoo's, one torch thread, evaluated on the same 10 episodes every 10k frames. Seeds outer, so the
first runs to finish are matched tdrl/SB3 pairs. About 17 core-hours on the 2-core reference machine (SAC ~60
updates/s on one thread); stopping and relaunching resumes every run where it was.

python slurm/launch.py local  slurm/sweeps/mujoco_offpolicy.py          # one run per core, resumable
python slurm/launch.py status runs/sweeps/mujoco_offpolicy --results
python benchmarks/learning.py --runs runs/sweeps/mujoco_offpolicy --markdown docs/learning-mujoco-<date>.md
"""

from tdrl.launch import Resources, Sweep, VariantLevel

sweep = Sweep(
    name="mujoco_offpolicy",
    recipe="benchmarks/learning_run.py",
    levels=[
        VariantLevel(keys=["task"], values=[["sac-halfcheetah"], ["td3-halfcheetah"], ["sac-hopper"], ["td3-hopper"]],
                     dir_names=["sac-halfcheetah", "td3-halfcheetah", "sac-hopper", "td3-hopper"]),
        VariantLevel(keys=["impl"], values=[["tdrl"], ["sb3"]], dir_names=["tdrl", "sb3"]),
    ],
    seeds=[0, 1],
    resources=Resources(cpus_per_run=1, mem_gb=4, time_min=180),
)
