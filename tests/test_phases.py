"""benchmarks/phases.py: every phase's functions are found in a real recipe's profile (a renamed or rewrapped
function would silently read 0 ms), and the phases with ``other`` add up to the training time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import phases  # noqa: E402


@pytest.mark.timeout(300)
def test_dqn_iteration_splits_into_phases():
    profile = phases.profile("dqn", frames=400, threads=1, flush_denormal=True)
    rows = {phase: (ms, share) for phase, ms, share in profile}
    assert list(rows)[-2:] == ["other", "total"]
    for phase in ("collect", "replay extend", "replay sample", "loss forward", "backward", "grad norm + clip",
                  "optimizer step", "target update", "bookkeeping"):
        assert rows[phase][0] > 0, phase
    assert sum(share for phase, (_, share) in rows.items() if phase != "total") == pytest.approx(1.0)
    assert 0 < rows["other"][1] < 0.6
