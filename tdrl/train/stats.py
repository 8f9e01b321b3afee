"""Episode and optimiser statistics for the trainers' log rows.

Episode statistics come from the collectors as rlpyt TrajInfos (``Return``, ``Length``, ``DiscountedReturn``,
``NonzeroRewards``, ...): one mapping (or object) per completed episode. They are reported per field as
``<prefix><field>_{mean,std,median,min,max}`` with snake-case field names (``train/return_mean``,
``eval/length_max``), rlpyt's Average/Std/Median/Min/Max.

Optimiser metrics (what the recipe passes to ``trainer.record``, typically one TensorDict per update) get the same
five statistics over the log interval; ``loss_x`` becomes ``loss/x`` (``loss/x_mean``...), other bare keys go
under ``train/``, keys holding a ``/`` stay as they are. These are the names :mod:`tdrl.log.stats` documents.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

__all__ = ["episode_stats", "eval_episodes", "new_episodes", "scalar_stats", "traj_to_dict"]

_STATS = {"mean": np.mean, "std": np.std, "median": np.median, "min": np.min, "max": np.max}


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def traj_to_dict(traj: Any) -> dict[str, float]:
    """One completed episode as ``{snake_field: float}`` (accepts mappings, TensorDicts and TrajInfo objects)."""
    if isinstance(traj, TensorDictBase):
        items = traj.items()
    elif isinstance(traj, Mapping):
        items = traj.items()
    elif hasattr(traj, "_asdict"):
        items = traj._asdict().items()
    else:
        items = vars(traj).items()
    out = {}
    for key, value in items:
        if isinstance(key, str) and not key.startswith("_"):
            try:
                out[_snake(key)] = float(value)
            except (TypeError, ValueError):
                continue
    return out


def episode_stats(trajs: Iterable[Any], prefix: str = "") -> dict[str, float]:
    """rlpyt's per-field Average/Std/Median/Min/Max over completed episodes; empty when there are none."""
    rows = [t if isinstance(t, dict) and all(isinstance(v, float) for v in t.values()) else traj_to_dict(t)
            for t in trajs]
    if not rows:
        return {}
    out: dict[str, float] = {}
    for key in rows[0]:
        values = np.asarray([r[key] for r in rows if key in r], dtype=np.float64)
        for stat, fn in _STATS.items():
            out[f"{prefix}{key}_{stat}"] = float(fn(values))
    return out


def new_episodes(collector: Any) -> list[dict[str, float]]:
    """Episodes the collector completed during its last batch, as dicts (see :func:`traj_to_dict`)."""
    trajs = getattr(collector, "traj_infos", None)
    if trajs is None:
        return []
    if callable(trajs):
        trajs = trajs()
    return [traj_to_dict(t) for t in trajs]


def eval_episodes(eval_collector: Any) -> list[dict[str, float]]:
    """Run one evaluation and return its completed episodes.

    Accepts an object with ``evaluate()`` (returning TrajInfos), a plain callable, or any tdrl collector
    (``collect()`` then its ``traj_infos``): e.g. a serial collector over the greedy policy with
    ``reset_mode="wait_reset"`` and ``batch_T`` ≥ the episode time limit gives exactly ``batch_B`` complete
    episodes per evaluation (rlpyt's eval collector: own envs, greedy policy, max steps).
    """
    if hasattr(eval_collector, "evaluate"):
        trajs = eval_collector.evaluate()
    elif hasattr(eval_collector, "collect") and hasattr(eval_collector, "traj_infos"):
        eval_collector.collect()
        trajs = eval_collector.traj_infos
    elif callable(eval_collector):
        trajs = eval_collector()
    else:
        raise TypeError(f"{type(eval_collector).__name__} has neither evaluate() nor collect(); cannot evaluate")
    return [traj_to_dict(t) for t in trajs]


def _metric_name(key: Any) -> str:
    if isinstance(key, tuple):
        key = "/".join(key)
    if "/" in key:
        return key
    if key.startswith("loss_"):
        return "loss/" + key[len("loss_"):]
    return "train/" + key


def scalar_stats(metrics: Iterable[Any]) -> dict[str, float]:
    """Per key, mean/std/median/min/max over a list of metric TensorDicts/mappings (one per update).

    Non-scalar entries are skipped. Keys are renamed by the rule in the module docstring, so
    ``loss_objective`` values become ``loss/objective_mean``, ``loss/objective_std``, ...
    """
    series: dict[str, list[Any]] = {}
    for m in metrics:
        items = m.items(include_nested=True, leaves_only=True) if isinstance(m, TensorDictBase) else m.items()
        for key, value in items:
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    continue
                value = value.detach().reshape(())
            elif not isinstance(value, (int, float)):
                continue
            series.setdefault(_metric_name(key), []).append(value)
    out: dict[str, float] = {}
    for name, values in series.items():
        if isinstance(values[0], torch.Tensor):
            arr = torch.stack([v.to(torch.float64) for v in values]).cpu().numpy()
        else:
            arr = np.asarray(values, dtype=np.float64)
        for stat, fn in _STATS.items():
            out[f"{name}_{stat}"] = float(fn(arr))
    return out
