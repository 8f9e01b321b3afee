"""tdrl's TD3 with RL-Zoo's settings (lr 1e-3, [400, 300]) on HalfCheetah-v5 and Hopper-v5, 200k frames, seed 0.

The rows ``td3-halfcheetah-rlzoo`` / ``td3-hopper-rlzoo`` of benchmarks/learning.py: the recipe with the
hyperparameters SB3's rows of slurm/sweeps/mujoco_offpolicy.py use, so a gap between tdrl's and SB3's TD3 there
reads as settings or as implementation. About 1.5 core-hours per run on the 2-core reference machine.

python slurm/launch.py local slurm/sweeps/td3_rlzoo_settings.py
python benchmarks/learning.py --runs runs/sweeps/td3_rlzoo_settings --keep benchmarks/results
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning_run import rows_sweep  # noqa: E402

sweep = rows_sweep("td3_rlzoo_settings", seeds=[0], time_min=180,
                   rows=[("td3-halfcheetah-rlzoo", "tdrl"), ("td3-hopper-rlzoo", "tdrl")])
