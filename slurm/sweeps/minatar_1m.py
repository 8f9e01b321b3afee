"""MinAtar Breakout to 1M frames: tdrl's DQN and R2D1 beside Stable-Baselines3's DQN, 1 seed (3 runs).

The rows of benchmarks/learning.py (dqn-minatar-breakout, r2d1-minatar-breakout: the MinAtar paper's settings, one
torch thread) with their budget raised from 250k to 1M frames; evaluation every 25k frames on 10 games. About 2
core-hours on the 2-core reference machine; stopping and relaunching resumes every run where it was.

python slurm/launch.py local  slurm/sweeps/minatar_1m.py
python benchmarks/learning.py --runs runs/sweeps/minatar_1m
    --keep docs/data --plots docs/data --markdown docs/atari.md#minatar
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning_run import rows_sweep  # noqa: E402

sweep = rows_sweep("minatar_1m", seeds=[0], overrides={"frames": 1_000_000}, rows=[
    ("dqn-minatar-breakout", "tdrl"), ("dqn-minatar-breakout", "sb3"), ("r2d1-minatar-breakout", "tdrl")])
