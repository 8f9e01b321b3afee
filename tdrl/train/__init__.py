"""Trainers: loop mechanics around a recipe's visible update (rlpyt's runners).

``SyncTrainer`` is rlpyt's MinibatchRl/MinibatchRlEval: collect a ``[B, T]`` batch, let the recipe update,
log/evaluate/checkpoint at intervals. See :mod:`tdrl.train.sync` for the API and semantics.
"""

from tdrl.train.stats import episode_stats, scalar_stats
from tdrl.train.sync import SyncTrainer, iteration_counts, updates_per_iteration

__all__ = ["SyncTrainer", "episode_stats", "iteration_counts", "scalar_stats", "updates_per_iteration"]
