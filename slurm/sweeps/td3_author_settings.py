"""tdrl's TD3 with its author's updated settings (lr 3e-4, [256, 256], batch 256) on HalfCheetah-v5 and Hopper-v5,
200k frames, seeds 0-1.

The rows ``td3-halfcheetah-author`` / ``td3-hopper-author`` of benchmarks/learning.py: the settings the TD3 rows of
slurm/sweeps/mujoco_offpolicy.py used until 2026-11-28, before RL-Zoo's (lr 1e-3, [400, 300]) replaced them. Kept
so the page's comparison of the two can be rerun. About 40 core-minutes per run on the 2-core reference machine.

python slurm/launch.py local slurm/sweeps/td3_author_settings.py
python benchmarks/learning.py --runs runs/sweeps/td3_author_settings --keep docs/data
    --markdown docs/mujoco.md#td3-author-settings
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning_run import rows_sweep  # noqa: E402

sweep = rows_sweep("td3_author_settings", seeds=[0, 1], time_min=180,
                   rows=[("td3-halfcheetah-author", "tdrl"), ("td3-hopper-author", "tdrl")])
