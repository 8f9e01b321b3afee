"""The one place where per-episode and per-update values become log columns (rlpyt's ``record_tabular_misc_stat``).

rlpyt wrote ``ReturnAverage, ReturnStd, ReturnMedian, ReturnMin, ReturnMax`` for every TrajInfo field and
optimiser value; tdrl writes the same five statistics (population std) under metric keys: ``ReturnAverage`` is
``train/return_mean`` (evaluation episodes: ``eval/return_mean``), ``LossAverage`` of a recorded ``loss_q`` is
``loss/q_mean``. Episode fields are the TrajInfo names in snake case (``DiscountedReturn`` →
``discounted_return``; fields starting with ``_`` are never logged; an agent group's ``<group>/Return`` is
``train/<group>/return_mean``). Optimiser metrics are renamed by
:func:`metric_name`. It sits in ``tdrl.utils`` so that trainers, the run logger and user scripts share it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

__all__ = ["STATISTICS", "metric_name", "metrics_to_floats", "summarize", "summarize_columns", "summarize_metrics",
           "summarize_records"]

STATISTICS: tuple[str, ...] = ("mean", "std", "median", "min", "max")
"""Column suffixes, in the order they are written (rlpyt's Average, Std, Median, Min, Max)."""


def summarize(key: str, values: Iterable[float] | Any) -> dict[str, float]:
    """``{key_mean, key_std, key_median, key_min, key_max}`` of ``values`` (numbers, an array or a tensor of any
    shape), all ``nan`` when empty."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).reshape(-1).numpy()
    try:
        arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as e:
        raise TypeError(f"statistic {key!r}: values must be real numbers ({e})") from None
    if arr.size == 0:
        return {f"{key}_{s}": math.nan for s in STATISTICS}
    return {f"{key}_mean": float(arr.mean()), f"{key}_std": float(arr.std()), f"{key}_median": float(np.median(arr)),
            f"{key}_min": float(arr.min()), f"{key}_max": float(arr.max())}


def _snake(name: str) -> str:
    """``DiscountedReturn`` -> ``discounted_return``; a path keeps its head: ``blueTeam/Return`` -> ``blueTeam/return``
    (an agent group's field)."""
    head, sep, tail = name.rpartition("/")
    return head + sep + re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", tail).lower()


def summarize_records(records: Sequence[Mapping[str, float]], prefix: str = "train/",
                      fields: Sequence[str] | None = None) -> dict[str, float]:
    """Statistics of each field over per-episode dicts (TrajInfos), under ``<prefix><snake_field>_<stat>``.

    ``fields`` default to every public field seen, in order (no columns at all without records); given, a field
    with no values yields ``nan`` columns, so an interval in which no episode ended still writes its columns.
    """
    if fields is None:
        fields = [k for k in dict.fromkeys(k for r in records for k in r) if not k.startswith("_")]
    out: dict[str, float] = {}
    for name in fields:
        out.update(summarize(f"{prefix}{_snake(name)}", [float(r[name]) for r in records if name in r]))
    return out


def summarize_columns(columns: Mapping[str, Iterable[float] | Any], prefix: str = "") -> dict[str, float]:
    """Statistics of each named series, e.g. one optimiser value per update: ``{"loss/actor": [...]}``."""
    out: dict[str, float] = {}
    for name, values in columns.items():
        out.update(summarize(f"{prefix}{name}", values))
    return out


def metric_name(key: str | tuple[str, ...]) -> str:
    """Log key of a recorded optimiser metric: ``loss_x`` → ``loss/x``, ``x`` → ``train/x``, ``a/b`` as given."""
    if isinstance(key, tuple):
        key = "/".join(key)
    if "/" in key:
        return key
    if key.startswith("loss_"):
        return "loss/" + key[len("loss_"):]
    return "train/" + key


def _scalars(metrics: Iterable[Any]) -> Iterable[dict[str, Any]]:
    for m in metrics:
        items = m.items(include_nested=True, leaves_only=True) if isinstance(m, TensorDictBase) else m.items()
        row: dict[str, Any] = {}
        for key, value in items:
            if isinstance(value, torch.Tensor):
                if value.numel() == 1:
                    row[metric_name(key)] = value.detach().reshape(())
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                row[metric_name(key)] = float(value)
        yield row


def _series(metrics: Iterable[Any]) -> tuple[int, dict[str, tuple[list[int], list[Any]]]]:
    """``(rows, {log key: (row numbers, values)})``, every key's tensors copied to the host in one transfer per
    device (not one ``.item()`` sync per update)."""
    series: dict[str, tuple[list[int], list[Any]]] = {}
    rows = 0
    for rows, row in enumerate(_scalars(metrics), 1):
        for name, value in row.items():
            at, values = series.setdefault(name, ([], []))
            at.append(rows - 1)
            values.append(value)
    for name, (at, values) in series.items():
        tensors: dict[Any, list[int]] = {}
        for i, value in enumerate(values):
            if isinstance(value, torch.Tensor):
                tensors.setdefault(value.device, []).append(i)
        for positions in tensors.values():
            host = torch.stack([values[i] for i in positions]).to(torch.float64).tolist()
            for i, v in zip(positions, host, strict=True):
                values[i] = v
        series[name] = (at, [float(v) for v in values])
    return rows, series


def metrics_to_floats(metrics: Iterable[Any]) -> list[dict[str, float]]:
    """Recorded metric entries (TensorDicts or mappings) as ``{log key: float}`` dicts, cheap to pickle.

    Nested TensorDict keys join with ``/``; entries that are not scalars are dropped.
    """
    rows, series = _series(metrics)
    out: list[dict[str, float]] = [{} for _ in range(rows)]
    for name, (at, values) in series.items():
        for i, v in zip(at, values, strict=True):
            out[i][name] = v
    return out


def summarize_metrics(metrics: Iterable[Any]) -> dict[str, float]:
    """Per key, the five statistics over a list of metric TensorDicts/mappings (one per update), renamed by
    :func:`metric_name`: recorded ``loss_objective`` values become ``loss/objective_mean``, ``..._std``, ...

    Tensors are stacked and copied to the host once per key and device (not one ``.item()`` sync per update).
    """
    out: dict[str, float] = {}
    for name, (_, values) in _series(metrics)[1].items():
        out.update(summarize(name, values))
    return out
