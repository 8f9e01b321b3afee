"""The columns of a progress.csv row that :meth:`tdrl.log.Run.log` computes itself, and which of them measure wall
time (those differ between otherwise identical runs; every other column is deterministic given the seed)."""

from __future__ import annotations

from typing import Any

__all__ = ["RESERVED_COLUMNS", "WALL_TIME_COLUMNS", "is_wall_time_column", "metric_value"]

RESERVED_COLUMNS: tuple[str, ...] = ("Iteration", "CumSteps", "CumTime", "StepsPerSecond", "NewCompletedTrajs",
                                     "CumCompletedTrajs", "CumUpdates", "UpdatesPerSecond", "ReplayRatio",
                                     "CumReplayRatio")
"""Columns :meth:`Run.log` computes itself (rlpyt's names); metrics may not use them."""
WALL_TIME_COLUMNS: frozenset[str] = frozenset({"CumTime", "StepsPerSecond", "UpdatesPerSecond"})
"""Columns that depend on wall-clock time, hence differ between otherwise identical runs."""


def is_wall_time_column(key: str) -> bool:
    """True for columns measured in wall-clock time (excluded when comparing runs)."""
    return key in WALL_TIME_COLUMNS or key.startswith("time/")


def metric_value(key: str, value: Any) -> float | int | None:
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (int, float)):  # tensor or numpy scalar
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            raise TypeError(f"metric {key!r}: expected a scalar, got shape {tuple(value.shape)}") from None
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, (int, float)):
        raise TypeError(f"metric {key!r}: expected a real number, got {type(value).__name__} {value!r}")
    return value
