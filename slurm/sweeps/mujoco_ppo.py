"""PPO on HalfCheetah-v5 and Hopper-v5, 1M frames, tdrl beside Stable-Baselines3, 3 seeds (12 runs).

Each run is one row of benchmarks/learning.py (benchmarks/learning_run.py): tdrl's recipe with RL-Zoo's MuJoCo PPO
hyperparameters (observations and rewards normalised as VecNormalize does) or SB3 with RL-Zoo's (VecNormalize), one
torch thread, evaluated on the same 5 episodes every 25k frames. Seeds outer: matched tdrl/SB3 pairs finish first.
Stopping and relaunching resumes every run where it was.

python slurm/launch.py local  slurm/sweeps/mujoco_ppo.py
python benchmarks/learning.py --runs runs/sweeps/mujoco_ppo
    --keep docs/data --plots docs/data --markdown docs/mujoco.md#ppo
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning_run import rows_sweep  # noqa: E402

sweep = rows_sweep("mujoco_ppo", seeds=[0, 1, 2], rows=[
    (task, impl) for task in ("ppo-halfcheetah", "ppo-hopper") for impl in ("tdrl", "sb3")])
