"""Turn per-episode and per-update values into progress.csv columns (rlpyt's ``record_tabular_misc_stat``).

rlpyt wrote ``ReturnAverage, ReturnStd, ReturnMedian, ReturnMin, ReturnMax`` for every TrajInfo and
optimizer field. tdrl writes the same five statistics under TorchRL-style metric keys::

    rlpyt            tdrl
    ReturnAverage    train/return_mean      (eval episodes: eval/return_mean)
    ReturnStd        train/return_std       (population std, ddof=0, as rlpyt's np.std)
    ReturnMedian     train/return_median
    ReturnMin        train/return_min
    ReturnMax        train/return_max
    LossAverage ...  loss/actor_mean ...    (one value per update since the last log)

Examples:
    >>> summarize_records([{"return": 1.0, "length": 10}, {"return": 3.0, "length": 30}], prefix="train/")[
    ...     "train/return_mean"]
    2.0
    >>> summarize_columns({"loss/actor": [0.5, 1.5]})["loss/actor_max"]
    1.5
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["STATISTICS", "summarize", "summarize_columns", "summarize_records"]

STATISTICS: tuple[str, ...] = ("mean", "std", "median", "min", "max")
"""Column suffixes, in the order they are written (rlpyt's Average, Std, Median, Min, Max)."""


def _as_float_array(key: str, values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # torch tensor, possibly on an accelerator
        values = values.detach().to("cpu").double().reshape(-1).numpy()
    try:
        return np.asarray(
            list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64
        ).reshape(-1)
    except (TypeError, ValueError) as e:
        raise TypeError(f"statistic {key!r}: values must be real numbers ({e})") from None


def summarize(key: str, values: Iterable[float] | Any) -> dict[str, float]:
    """``{key_mean, key_std, key_median, key_min, key_max}`` of ``values`` (all ``nan`` when empty).

    Args:
        key: column prefix, e.g. ``"train/return"``.
        values: numbers, a numpy array or a tensor (any shape; flattened).
    """
    arr = _as_float_array(key, values)
    if arr.size == 0:
        return {f"{key}_{s}": math.nan for s in STATISTICS}
    return {
        f"{key}_mean": float(arr.mean()),
        f"{key}_std": float(arr.std()),
        f"{key}_median": float(np.median(arr)),
        f"{key}_min": float(arr.min()),
        f"{key}_max": float(arr.max()),
    }


def summarize_records(
    records: Sequence[Mapping[str, float]],
    prefix: str = "train/",
    fields: Sequence[str] | None = None,
) -> dict[str, float]:
    """Statistics of each field over a list of per-episode dicts (rlpyt's TrajInfos).

    Args:
        records: e.g. ``[{"return": 21.0, "length": 21}, ...]`` for the episodes completed since the last log.
        prefix: prepended to each field (``"train/"``, ``"eval/"``).
        fields: the fields to summarize; given, a field with no values yields ``nan`` columns (so an interval
            in which no episode ended still writes the columns). Default: every field seen, in order.
    """
    if fields is None:
        fields = list(dict.fromkeys(k for r in records for k in r))
    out: dict[str, float] = {}
    for name in fields:
        out.update(summarize(f"{prefix}{name}", [r[name] for r in records if name in r]))
    return out


def summarize_columns(
    columns: Mapping[str, Iterable[float] | Any], prefix: str = ""
) -> dict[str, float]:
    """Statistics of each series, e.g. one optimizer value per update: ``{"loss/actor": [...]}``."""
    out: dict[str, float] = {}
    for name, values in columns.items():
        out.update(summarize(f"{prefix}{name}", values))
    return out
