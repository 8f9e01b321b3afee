"""Run a sweep locally over hardware slots or on SLURM, and follow it. See ``python slurm/launch.py -h``.

python slurm/launch.py plan   slurm/sweeps/ppo_cartpole_lr.py        # validate, print the runs
python slurm/launch.py local  slurm/sweeps/ppo_cartpole_lr.py        # queue over this machine's cores
python slurm/launch.py slurm  slurm/sweeps/ppo_cartpole_lr.py --partition debug --time 30 --mem 4
python slurm/launch.py status runs/sweeps/ppo_cartpole_lr --results  # states, last progress row, results.csv
"""

import sys

from tdrl.launch.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="slurm/launch.py"))
