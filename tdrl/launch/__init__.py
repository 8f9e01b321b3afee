"""Experiments: variants, sweep files planned into validated runs, hardware slots, the local launcher, SLURM job
arrays through submitit that requeue and resume (submitit is imported only when a sweep is submitted), run status
and results, and torch.distributed from SLURM's variables.
"""

from tdrl.launch.distributed import DistEnv, init_distributed_from_slurm, slurm_dist_env
from tdrl.launch.local import RunOutcome, launch_local
from tdrl.launch.slots import Slot, SlotError, current_slot_cpus, make_slots
from tdrl.launch.status import collect_results, format_status, sweep_status
from tdrl.launch.sweep import Resources, RunSpec, Sweep, SweepError, SweepPlan, load_sweep, plan_sweep
from tdrl.launch.variants import VariantLevel, load_variant, make_variants, save_variant

__all__ = ["DistEnv", "Resources", "RunOutcome", "RunSpec", "Slot", "SlotError", "Sweep", "SweepError", "SweepPlan",
    "VariantLevel", "collect_results", "current_slot_cpus", "format_status", "init_distributed_from_slurm",
    "launch_local", "load_sweep", "load_variant", "make_slots", "make_variants", "plan_sweep", "save_variant",
    "slurm_dist_env", "sweep_status"]
