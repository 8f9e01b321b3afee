"""Learning curves from run directories: ``tdrl plot RUN_DIR... [--metric KEY ...] [--out DIR]``.

Every directory holding a ``progress.csv`` at or below the arguments is a run. Runs whose variant differs only in
the seed form one group, drawn against env frames (``CumSteps``) as the interquartile mean (IQM) over seeds with a
95% stratified-bootstrap confidence band: rliable's convention (Agarwal et al. 2021, "Deep RL at the Edge of the
Statistical Precipice"), robust to an outlier seed where a mean and a t band over 3 seeds are not, and never
outside the returns the seeds reached. The variant is the launcher's ``variant.json`` (in the run directory or its
parent), else ``config.json``. One PNG per metric (matplotlib's Agg backend: no display needed), and a summary of
each variant's final IQM and CI, printed and written as ``summary.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tdrl.config import flatten
from tdrl.log.progress import read_progress_floats

__all__ = ["CurveGroup", "find_runs", "group_runs", "iqm", "iqm_with_ci", "main", "plot_learning_curves"]

X_KEY = "CumSteps"
DEFAULT_METRICS = ("eval/return_mean", "train/return_mean")
_NOT_VARIANT = {"run.dir", "run.root", "run.force", "run.name", "run_ID", "name"}
BOOTSTRAP_REPS = 2000  # rliable uses 2000-50000; 2000 puts the 95% bounds within ~1% of the IQM's spread


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


def iqm(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Interquartile mean along ``axis``: the mean of the middle 50% after cutting ``floor(n/4)`` values from each
    end (``scipy.stats.trim_mean(values, 0.25)``, rliable's ``aggregate_iqm``; the plain mean below 4 seeds)."""
    ordered = np.sort(values, axis=axis)
    n = ordered.shape[axis]
    cut = n // 4
    return np.take(ordered, np.arange(cut, n - cut), axis=axis).mean(axis=axis)


def iqm_with_ci(values: np.ndarray, *, reps: int = BOOTSTRAP_REPS, seed: int = 0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQM over runs of ``values`` ``[runs, points]`` and its 95% percentile-bootstrap interval: the runs are
    resampled with replacement (one task, so rliable's stratified bootstrap is this), the bounds clipped to the
    values the runs reached. One run: a zero-width band."""
    center = iqm(values)
    n = values.shape[0]
    if n < 2:
        return center, center.copy(), center.copy()
    draws = np.random.default_rng(seed).integers(0, n, size=(reps, n))
    low, high = np.percentile(iqm(values[draws], axis=1), [2.5, 97.5], axis=0)
    return center, np.maximum(low, values.min(axis=0)), np.minimum(high, values.max(axis=0))


def _on_shared_grid(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The x values every run covers, and each run's y on them ``[runs, points]`` (interpolated where runs logged
    at different frames)."""
    xs = [c[0] for c in curves]
    lo, hi = max(x.min() for x in xs), min(x.max() for x in xs)
    grid = np.unique(np.concatenate(xs))
    grid = grid[(grid >= lo) & (grid <= hi)]
    return grid, np.stack([np.interp(grid, x, y) for x, y in curves])


def plot_learning_curves(
    paths: Sequence[Path | str], *, metrics: Sequence[str] | None = None, out_dir: Path | str | None = None
) -> dict[Path, int]:
    """Write one PNG per metric with one IQM curve (and 95% band) per variant group, and ``summary.csv`` (one row
    per metric and variant: seeds, final frames, final IQM and its CI); returns ``{png: curves}``.

    ``metrics`` default to ``eval/return_mean``, else ``train/return_mean``; files go to ``out_dir`` (default
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
    summary: list[dict[str, Any]] = []
    for metric in metrics:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        drawn = 0
        for i, group in enumerate(groups):
            curves = [c for c in (_curve(r, metric) for r in group.runs) if c is not None]
            if not curves:
                continue
            x, ys = _on_shared_grid(curves)
            center, low, high = iqm_with_ci(ys)
            color = colors[i % len(colors)]
            ax.plot(x, center, color=color, linewidth=1.8, label=f"{group.label} (n={len(curves)})")
            if len(curves) > 1:
                ax.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)
            drawn += 1
            summary.append({"metric": metric, "variant": group.label, "seeds": len(curves), "frames": int(x[-1]),
                            "iqm": center[-1], "ci_low": low[-1], "ci_high": high[-1]})
        ax.set_xlabel("env frames")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric}: IQM and 95% bootstrap CI over seeds")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{metric.replace('/', '_')}.png"
        fig.savefig(path)
        plt.close(fig)
        written[path] = drawn
    with (out / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["metric", "variant", "seeds", "frames", "iqm", "ci_low", "ci_high"])
        writer.writeheader()
        writer.writerows(summary)
    return written


def summary_table(path: Path) -> str:
    """``summary.csv`` as aligned text: one line per metric and variant, with the final IQM and its 95% CI."""
    rows = [[r["metric"], r["variant"], r["seeds"], f"{int(r['frames']):,}",
             f"{float(r['iqm']):.4g} [{float(r['ci_low']):.4g}, {float(r['ci_high']):.4g}]"]
            for r in csv.DictReader(path.open())]
    rows.insert(0, ["metric", "variant", "seeds", "frames", "final IQM [95% CI]"])
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


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
    summary = next(iter(written)).parent / "summary.csv"
    print(f"{summary}\n{summary_table(summary)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
