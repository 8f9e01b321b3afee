"""Valid ranges a config field declares in its type, ``lr: Annotated[float, Range(gt=0)]``, so the value is checked
where it is set (a command-line override, a sweep variant, a saved config) and not first by torch minutes later;
:mod:`tdrl.config` checks them and shows them in ``--help``. Plain values: no torch, no numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

__all__ = ["AnyFloat", "Count", "Fraction", "LayerSizes", "Length", "NonNegativeFloat", "NonNegativeInt",
           "PositiveFloat", "PositiveFraction", "Range"]


@dataclass(frozen=True, repr=False)
class Range:
    """Bounds of a number: ``gt``/``ge`` from below, ``lt``/``le`` from above (``Range()``: any number, declared on
    purpose). NaN is never in range."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def __post_init__(self) -> None:
        if (self.gt is not None and self.ge is not None) or (self.lt is not None and self.le is not None):
            raise ValueError(f"{self!r}: give one lower bound (gt or ge) and one upper bound (lt or le) at most")

    def __repr__(self) -> str:
        bounds = ", ".join(f"{k}={v!r}" for k, v in self._bounds())
        return f"Range({bounds})"

    def __str__(self) -> str:
        """``> 0``, ``>= 1``, ``in (0, 1]``; empty for no bounds."""
        low = f"({self.gt}" if self.gt is not None else f"[{self.ge}" if self.ge is not None else None
        high = f"{self.lt})" if self.lt is not None else f"{self.le}]" if self.le is not None else None
        if low is not None and high is not None:
            return f"in {low}, {high}"
        return " ".join(f"{_SYMBOLS[k]} {v}" for k, v in self._bounds())

    def _bounds(self) -> list[tuple[str, float]]:
        return [(k, v) for k in ("gt", "ge", "lt", "le") if (v := getattr(self, k)) is not None]

    def violation(self, value: float) -> str | None:
        """Why ``value`` is out of range (``"-1.0 must be > 0"``), or None when it is in range."""
        if math.isnan(value):
            return f"{value} is not a number"
        ok = ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
              and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))
        return None if ok else f"{value!r} must be {self}"


_SYMBOLS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


@dataclass(frozen=True)
class Length:
    """Least number of items of a list field (``Length(1)``: not empty); its items declare their own range."""

    min: int = 1

    def __str__(self) -> str:
        return "non-empty" if self.min == 1 else f"{self.min}+ item"

    def violation(self, value: list | tuple) -> str | None:
        """Why ``value`` is too short, or None."""
        if len(value) >= self.min:
            return None
        return f"{list(value)!r} must have at least {self.min} item{'s' if self.min > 1 else ''}"


# --- The ranges tdrl's config fields use (tdrl.config re-exports them; tests/test_config.py walks the recipes) ---

AnyFloat = Annotated[float, Range()]
"""Any number, on purpose (a return threshold, a log-std, an atom's value)."""
PositiveFloat = Annotated[float, Range(gt=0)]
"""> 0: learning rates, optimizer epsilons, clip ranges, scales."""
NonNegativeFloat = Annotated[float, Range(ge=0)]
""">= 0: loss coefficients, noise levels, exponents."""
Fraction = Annotated[float, Range(ge=0, le=1)]
"""In [0, 1]: probabilities, epsilons, GAE lambda, importance exponents."""
PositiveFraction = Annotated[float, Range(gt=0, le=1)]
"""In (0, 1]: discounts, polyak factors."""
Count = Annotated[int, Range(ge=1)]
""">= 1: sizes, counts, intervals."""
NonNegativeInt = Annotated[int, Range(ge=0)]
""">= 0: seeds, frame counts where 0 means none or off."""
LayerSizes = Annotated[list[Count], Length(1)]
"""Hidden layer widths: at least one layer, each >= 1."""
