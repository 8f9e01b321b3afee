"""Experiments: variants, hardware slots, a local launcher and SLURM sweeps through submitit.

* :mod:`~tdrl.launch.variants` -- rlpyt's ``VariantLevel`` / ``make_variants`` (levels crossed in order),
  ``variant.json``; variants merge strictly into a recipe's config (:func:`tdrl.config.merge_nested`).
* :mod:`~tdrl.launch.sweep` -- ``Sweep`` files (recipe, levels, seeds, overrides, ``Resources``) planned into
  validated runs before anything starts.
* :mod:`~tdrl.launch.slots` -- hardware slots: cores/GPUs per run, pinning and the slot's environment.
* :mod:`~tdrl.launch.local` -- the local launcher (rlpyt's ``run_experiments``).
* :mod:`~tdrl.launch.submit` / :mod:`~tdrl.launch.job` -- SLURM job arrays through submitit, requeued on
  preemption and time-out, resumed from the run directory.
* :mod:`~tdrl.launch.status` -- each run's state and last progress row; results of finished runs.
* :mod:`~tdrl.launch.distributed` -- torch.distributed from SLURM's variables for multi-task jobs.

submitit is imported only when a sweep is submitted.
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
