"""`tdrl plot`: runs grouped by variant, one curve per group, IQM and 95% bootstrap band clipped to the observed
returns, a summary table; and video encoding."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest

from tdrl.cli import main as cli_main
from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig
from tdrl.log import Run, VideoError, write_video
from tdrl.plot import group_runs, iqm, iqm_with_ci, plot_learning_curves


@dataclass
class Optim:
    lr: float = 1e-3


@dataclass
class Cfg:
    optim: Optim = field(default_factory=Optim)
    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(
        default_factory=lambda: LoggerConfig(wandb=False, progress_bar=False)
    )
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def _make_sweep(root, lrs=(1e-3, 3e-4), seeds=(0, 1, 2)):
    for lr in lrs:
        for seed in seeds:
            cfg = Cfg(
                optim=Optim(lr=lr),
                run=RunConfig(dir=str(root / f"lr{lr}" / f"run_{seed}"), seed=seed),
            )
            run = Run.open(
                config=cfg,
                run=cfg.run,
                logger=cfg.logger,
                checkpoint=cfg.checkpoint,
                name="ppo",
                tee=False,
            )
            rng = np.random.default_rng(seed)
            for i in range(8):
                # seeds log at different frames: the plot must interpolate
                frames = (i + 1) * (1000 + 10 * seed)
                run.log({"eval/return_mean": lr * 1e4 * i + rng.normal()}, step=frames, iteration=i)
            run.finish()


def _curve_colors_in_png(path, n_colors=10) -> int:
    """Count how many of matplotlib's default cycle colors are drawn in the PNG (one per curve)."""
    import matplotlib.colors
    import matplotlib.image
    import matplotlib.pyplot as plt

    pixels = matplotlib.image.imread(path)[..., :3]
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"][:n_colors]
    found = 0
    for color in cycle:
        rgb = np.array(matplotlib.colors.to_rgb(color))
        if rgb.max() - rgb.min() < 0.2:
            continue  # the cycle's grey also appears in antialiased axis text
        if (np.abs(pixels - rgb).max(axis=-1) < 0.02).sum() > 50:
            found += 1
    return found


def test_groups_by_config_minus_seed(tmp_path):
    _make_sweep(tmp_path)
    runs = sorted(p.parent for p in tmp_path.rglob("progress.csv"))
    groups = group_runs(runs)
    assert sorted(g.label for g in groups) == ["optim.lr=0.0003", "optim.lr=0.001"]
    assert all(len(g.runs) == 3 for g in groups)


def test_plot_png_has_one_curve_per_variant(tmp_path):
    _make_sweep(tmp_path)
    written = plot_learning_curves([tmp_path], out_dir=tmp_path / "plots")
    (path,) = written
    assert path.name == "eval_return_mean.png" and written[path] == 2
    assert _curve_colors_in_png(path) == 2
    one = plot_learning_curves([tmp_path / "lr0.001"], out_dir=tmp_path / "one")
    assert list(one.values()) == [1] and _curve_colors_in_png(next(iter(one))) == 1


def test_variant_json_overrides_config_grouping(tmp_path):
    _make_sweep(tmp_path, lrs=(1e-3,), seeds=(0, 1, 2, 3))
    # the launcher says these are two variants (e.g. a setting not in the config)
    for seed in (0, 1, 2, 3):
        variant = {"algo": {"tau": 0.005 if seed < 2 else 0.01}, "run": {"seed": seed}}
        (tmp_path / "lr0.001" / f"run_{seed}" / "variant.json").write_text(json.dumps(variant))
    groups = group_runs(sorted(p.parent for p in tmp_path.rglob("progress.csv")))
    assert sorted((g.label, len(g.runs)) for g in groups) == [
        ("algo.tau=0.005", 2),
        ("algo.tau=0.01", 2),
    ]


def test_cli_plot_and_errors(tmp_path):
    _make_sweep(tmp_path, lrs=(1e-3,), seeds=(0,))
    out = subprocess.run(
        [sys.executable, "-m", "tdrl.cli", "plot", str(tmp_path), "--out", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert (
        "eval_return_mean.png  (1 curve)" in out.stdout
        and (tmp_path / "p" / "eval_return_mean.png").is_file()
    )
    assert "final IQM [95% CI]" in out.stdout and "summary.csv" in out.stdout


def test_iqm_is_the_mean_of_the_middle_half():
    assert iqm(np.array([1.0, 2.0, 3.0, 4.0, 100.0])) == 3.0  # floor(5/4) = 1 cut from each end
    assert iqm(np.array([0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 1e6])) == 35.0  # 2 cut from each end
    assert iqm(np.array([500.0, 500.0, 20.0])) == 340.0  # under 4 seeds: the mean
    columns = np.array([[1.0, 5.0], [2.0, 6.0], [3.0, 7.0], [50.0, 9.0]])
    np.testing.assert_allclose(iqm(columns), [2.5, 6.5])


def test_bootstrap_band_stays_within_the_observed_returns():
    # CartPole: two seeds solved, one stuck. A t band over 3 seeds reached far above 500 and below 0 here.
    returns = np.array([[500.0, 500.0], [500.0, 480.0], [20.0, 10.0]])
    center, low, high = iqm_with_ci(returns)
    np.testing.assert_allclose(center, returns.mean(axis=0))
    assert (returns.min(axis=0) <= low).all() and (low <= center).all()
    assert (center <= high).all() and (high <= returns.max(axis=0)).all()
    assert low[0] < 100 and high[0] == 500.0  # the band shows the stuck seed without leaving [20, 500]
    many = np.random.default_rng(0).normal(size=(40, 1))  # 40 seeds of N(0, 1): the band is about +-0.35
    center, low, high = iqm_with_ci(many)
    assert low[0] < 0 < high[0] and 0.4 < high[0] - low[0] < 1.0
    one = iqm_with_ci(returns[:1])
    assert all((part == returns[0]).all() for part in one)


def test_summary_csv_has_the_final_iqm_and_ci_per_variant(tmp_path):
    _make_sweep(tmp_path, seeds=(0, 1, 2, 3))
    plot_learning_curves([tmp_path], out_dir=tmp_path / "plots")
    rows = {r["variant"]: r for r in csv.DictReader((tmp_path / "plots" / "summary.csv").open())}
    assert sorted(rows) == ["optim.lr=0.0003", "optim.lr=0.001"]
    row = rows["optim.lr=0.001"]
    assert row["metric"] == "eval/return_mean" and row["seeds"] == "4"
    frames = int(row["frames"])
    assert frames == 8 * 1000  # the last frame every seed logged (seed 0 stops first)
    finals = []
    for seed in range(4):  # each seed's curve at that frame, from its progress.csv
        log = list(csv.DictReader((tmp_path / "lr0.001" / f"run_{seed}" / "progress.csv").open()))
        xs, ys = [float(r["CumSteps"]) for r in log], [float(r["eval/return_mean"]) for r in log]
        finals.append(np.interp(frames, xs, ys))
    assert float(row["iqm"]) == pytest.approx(iqm(np.array(finals)))
    assert min(finals) <= float(row["ci_low"]) <= float(row["iqm"]) <= float(row["ci_high"]) <= max(finals)


def test_cli_errors(tmp_path, capsys):
    _make_sweep(tmp_path, lrs=(1e-3,), seeds=(0,))
    capsys.readouterr()
    with pytest.raises(SystemExit) as bad:
        cli_main(["plot", str(tmp_path), "--metric", "nope"])
    err = capsys.readouterr().err
    assert (
        bad.value.code == 2 and "['nope'] not in progress.csv" in err and "eval/return_mean" in err
    )
    with pytest.raises(SystemExit) as missing:
        cli_main(["plot", str(tmp_path / "none")])
    assert missing.value.code == 2 and "does not exist" in capsys.readouterr().err
    assert cli_main(["plto"]) == 2 and "unknown command 'plto'" in capsys.readouterr().err
    assert cli_main([]) == 2 and "plot" in capsys.readouterr().out


def test_write_video_shapes_and_errors(tmp_path):
    iio = pytest.importorskip("imageio.v3")
    pytest.importorskip("imageio_ffmpeg")
    thwc = np.random.default_rng(0).integers(0, 255, size=(6, 21, 30, 3), dtype=np.uint8)
    path = write_video(thwc, tmp_path / "a" / "v.mp4", fps=5)
    decoded = iio.imread(path)
    assert decoded.shape == (6, 22, 30, 3)  # odd height padded to even for H.264, not rescaled
    # floats in [0, 1], channels first
    tchw = np.random.default_rng(1).random((4, 3, 16, 16), dtype=np.float32)
    assert iio.imread(write_video(tchw, tmp_path / "b.mp4")).shape == (4, 16, 16, 3)
    with pytest.raises(VideoError, match="shape"):
        write_video(np.zeros((4, 5)), tmp_path / "c.mp4")
    with pytest.raises(VideoError, match="no frames"):
        write_video(np.zeros((0, 8, 8, 3), dtype=np.uint8), tmp_path / "d.mp4")
