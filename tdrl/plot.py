"""Learning curves from run directories: ``tdrl plot RUN_DIR... [--metric KEY ...] [--out DIR]``.

Every directory holding a ``progress.csv`` at or below the arguments is a run. Runs whose variant differs only in
the seed form one group, drawn as its mean with a 95% confidence band (Student t over seeds) against env frames
(``CumSteps``); the variant is the launcher's ``variant.json`` (in the run directory or its parent), else
``config.json``. One PNG per metric, drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tdrl.config import flatten
from tdrl.log.progress import read_progress_floats

__all__ = ["CurveGroup", "find_runs", "group_runs", "main", "plot_learning_curves"]

X_KEY = "CumSteps"
DEFAULT_METRICS = ("eval/return_mean", "train/return_mean")
_NOT_VARIANT = {"run.dir", "run.root", "run.force", "run.name", "run_ID", "name"}
# Two-sided 95% Student t quantiles for 1..30 degrees of freedom; 1.96 beyond (no scipy dependency).
_T95 = tuple(
    float(t)
    for t in """12.706 4.303 3.182 2.776 2.571 2.447 2.365 2.306 2.262 2.228 2.201 2.179 2.160 2.145
    2.131 2.120 2.110 2.101 2.093 2.086 2.080 2.074 2.069 2.064 2.060 2.056 2.052 2.048 2.045 2.042""".split()
)


@dataclass
class CurveGroup:
    """Runs of one variant: ``label`` (the keys that set it apart) and their directories."""

    label: str
    variant: dict[str, Any]
    runs: list[Path]


def find_runs(paths: Iterable[Path | str]) -> list[Path]:
    """Run directories (holding ``progress.csv``) at or below each path, sorted, without duplicates.

    Raises:
        FileNotFoundError: a path does not exist or holds no run.
    """
    runs: dict[Path, None] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist")
        found = [p] if (p / "progress.csv").is_file() else sorted(f.parent for f in p.rglob("progress.csv"))
        if not found:
            raise FileNotFoundError(f"no progress.csv at or below {p}")
        runs.update(dict.fromkeys(r.resolve() for r in found))
    return list(runs)


def _is_seed_key(key: str) -> bool:
    return key in _NOT_VARIANT or key.rsplit(".", 1)[-1] == "seed"


def _variant(run_dir: Path) -> dict[str, Any]:
    for path in (run_dir / "variant.json", run_dir.parent / "variant.json", run_dir / "config.json"):
        if path.is_file():
            data = json.loads(path.read_text())
            flat = flatten(data) if isinstance(data, dict) else {"variant": data}
            return {k: v for k, v in flat.items() if not _is_seed_key(k)}
    return {"run": run_dir.name}


def group_runs(run_dirs: Sequence[Path]) -> list[CurveGroup]:
    """Group runs whose variant (config minus seed) is equal; labels name the keys that differ between groups."""
    groups: dict[str, tuple[dict[str, Any], list[Path]]] = {}
    for run_dir in run_dirs:
        variant = _variant(Path(run_dir))
        key = json.dumps(variant, sort_keys=True, default=str)
        groups.setdefault(key, (variant, []))[1].append(Path(run_dir))
    variants = [v for v, _ in groups.values()]
    all_keys = sorted({k for v in variants for k in v})
    differing = [k for k in all_keys if len({json.dumps(v.get(k), default=str) for v in variants}) > 1]
    out = []
    for i, (variant, runs) in enumerate(groups.values()):
        label = ", ".join(f"{k}={variant.get(k)}" for k in differing) or _default_label(runs[0], i)
        out.append(CurveGroup(label, variant, runs))
    return out


def _default_label(run_dir: Path, index: int) -> str:
    params = run_dir / "params.json"
    if params.is_file():
        name = json.loads(params.read_text()).get("name")
        if name:
            return str(name)
    return f"group {index}"


def _curve(run_dir: Path, metric: str) -> tuple[np.ndarray, np.ndarray] | None:
    columns = read_progress_floats(run_dir / "progress.csv")
    if metric not in columns or X_KEY not in columns:
        return None
    x, y = np.asarray(columns[X_KEY]), np.asarray(columns[metric])
    keep = np.isfinite(x) & np.isfinite(y)
    return (x[keep], y[keep]) if keep.any() else None


def _mean_and_band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and 95% CI half-width over runs, on the x values shared by all (interpolated where they differ)."""
    xs = [c[0] for c in curves]
    lo, hi = max(x.min() for x in xs), min(x.max() for x in xs)
    grid = np.unique(np.concatenate(xs))
    grid = grid[(grid >= lo) & (grid <= hi)]
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    n = ys.shape[0]
    mean = ys.mean(axis=0)
    if n < 2:
        return grid, mean, np.zeros_like(mean)
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return grid, mean, t * ys.std(axis=0, ddof=1) / math.sqrt(n)


def plot_learning_curves(
    paths: Sequence[Path | str], *, metrics: Sequence[str] | None = None, out_dir: Path | str | None = None
) -> dict[Path, int]:
    """Write one PNG per metric with one mean curve (and 95% band) per variant group; returns ``{png: curves}``.

    ``metrics`` default to ``eval/return_mean``, else ``train/return_mean``; PNGs go to ``out_dir`` (default
    ``<first path>/plots``).

    Raises:
        FileNotFoundError: no runs found.
        ValueError: none of the requested metrics is in any run's progress.csv (the message lists columns).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = find_runs(paths)
    groups = group_runs(runs)
    available = sorted({k for r in runs for k in read_progress_floats(r / "progress.csv")})
    if metrics is None:
        default = [m for m in DEFAULT_METRICS if m in available][:1]
        if not default:
            raise ValueError(f"no {' or '.join(DEFAULT_METRICS)} column in {len(runs)} run(s); pick one of {available}")
        metrics = default
    missing = [m for m in metrics if m not in available]
    if missing:
        raise ValueError(f"metric(s) {missing} not in progress.csv of {len(runs)} run(s); columns: {available}")
    out = Path(out_dir) if out_dir is not None else Path(paths[0]) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written: dict[Path, int] = {}
    for metric in metrics:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        drawn = 0
        for i, group in enumerate(groups):
            curves = [c for c in (_curve(r, metric) for r in group.runs) if c is not None]
            if not curves:
                continue
            x, mean, half = _mean_and_band(curves)
            color = colors[i % len(colors)]
            ax.plot(x, mean, color=color, linewidth=1.8, label=f"{group.label} (n={len(curves)})")
            if len(curves) > 1:
                ax.fill_between(x, mean - half, mean + half, color=color, alpha=0.2, linewidth=0)
            drawn += 1
        ax.set_xlabel("env frames")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric}: mean and 95% CI over seeds")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{metric.replace('/', '_')}.png"
        fig.savefig(path)
        plt.close(fig)
        written[path] = drawn
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``tdrl plot RUN_DIR... [--metric KEY ...] [--out DIR]``."""
    parser = argparse.ArgumentParser(prog="tdrl plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="run directories or folders above them")
    parser.add_argument("--metric", nargs="+", default=None, help="progress.csv columns (default: return)")
    parser.add_argument("--out", default=None, help="output folder (default: <first path>/plots)")
    args = parser.parse_args(argv)
    try:
        written = plot_learning_curves(args.paths, metrics=args.metric, out_dir=args.out)
    except (FileNotFoundError, ValueError) as e:
        parser.exit(2, f"error: {e}\n")
    for path, n in written.items():
        print(f"{path}  ({n} curve{'s' if n != 1 else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
