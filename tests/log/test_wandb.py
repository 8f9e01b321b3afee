"""W&B mirror with real offline runs: files written, config logged, run id kept across a resume, videos."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig
from tdrl.log import Run
from tdrl.log.wandb_sink import resolve_wandb_mode


@dataclass
class Cfg:
    lr: float = 0.1
    tag: str = "cfg-marker-7731"
    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(
        default_factory=lambda: LoggerConfig(
            wandb=True, progress_bar=False, group="sweepA", project="tdrl-test"
        )
    )
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_root"))
    (tmp_path / "wandb_root").mkdir()
    return tmp_path / "wandb_root" / "wandb"


def _open(cfg: Cfg) -> Run:
    return Run.open(
        config=cfg, run=cfg.run, logger=cfg.logger, checkpoint=cfg.checkpoint, name="sac"
    )


def _offline_runs(wandb_dir):
    return sorted(p for p in wandb_dir.iterdir() if p.name.startswith("offline-run-"))


@pytest.mark.timeout(120)
def test_offline_run_writes_files_and_keeps_its_id_across_resume(offline, tmp_path):
    cfg = Cfg(run=RunConfig(dir=str(tmp_path / "r"), seed=4))
    run = _open(cfg)
    assert os.environ["WANDB_MODE"] == "offline"
    for i in range(3):
        run.log({"train/return_mean": float(i)}, step=(i + 1) * 100, iteration=i)
    run.save_checkpoint({"i": 2}, 2)
    run.finish({"eval/return_mean": 3.0})
    run_id = (tmp_path / "r" / "wandb_id.txt").read_text().strip()
    assert run_id == run.wandb_id and len(run_id) == 8
    (first,) = _offline_runs(offline)
    assert first.name.endswith(f"-{run_id}")
    # W&B's record log (strings are stored verbatim); wandb-core may still be flushing it after finish()
    deadline = time.monotonic() + 20
    while b"cfg-marker-7731" not in (records := (first / f"run-{run_id}.wandb").read_bytes()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert b"sweepA" in records and b"tdrl-test" in records  # group and project
    assert b"cfg-marker-7731" in records  # the config is logged
    # metrics, on the env-frames axis
    assert b"train/return_mean" in records and b"frames" in records

    resumed = _open(cfg)
    assert resumed.wandb_id == run_id
    assert resumed.load_checkpoint() == {"i": 2}
    resumed.log({"train/return_mean": 4.0}, step=400, iteration=3)
    resumed.finish()
    runs = _offline_runs(offline)
    assert len(runs) == 2 and all(
        p.name.endswith(f"-{run_id}") or p.name.endswith(f"-{run_id}-1") for p in runs
    )
    assert all((p / f"run-{run_id}.wandb").is_file() for p in runs)
    assert os.environ["WANDB_MODE"] == "offline"  # never rewritten by tdrl


@pytest.mark.timeout(120)
def test_video_is_written_and_attached(offline, tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    cfg = Cfg(run=RunConfig(dir=str(tmp_path / "r")))
    run = _open(cfg)
    frames = np.random.default_rng(0).integers(0, 255, size=(12, 33, 40, 3), dtype=np.uint8)
    path = run.log_video(frames, step=1000, key="eval/video", fps=10)
    run.finish()
    assert path == tmp_path / "r" / "videos" / "video_000000001000.mp4" and path.stat().st_size > 0
    (wandb_run,) = _offline_runs(offline)
    media = list((wandb_run / "files" / "media" / "videos").rglob("*.mp4"))
    assert len(media) == 1


def test_disabled_mode_builds_no_wandb_run(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = _open(Cfg(run=RunConfig(dir=str(tmp_path / "r"))))
    run.log({"x": 1.0}, step=1)
    run.finish()
    assert run.wandb_id is None
    assert (
        not (tmp_path / "r" / "wandb").exists() and not (tmp_path / "r" / "wandb_id.txt").exists()
    )


def test_mode_resolution(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_wandb_mode("offline") == "offline"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert resolve_wandb_mode("online") == "offline"  # the environment wins (CI, tests)
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ValueError, match="WANDB_MODE='sometimes'"):
        resolve_wandb_mode("offline")
    monkeypatch.delenv("WANDB_MODE")
    with pytest.raises(ValueError, match="logger.wandb_mode='cloud'"):
        resolve_wandb_mode("cloud")


def test_tensorboard_is_optional(tmp_path):
    cfg = Cfg(
        run=RunConfig(dir=str(tmp_path / "r")), logger=LoggerConfig(wandb=False, tensorboard=True)
    )
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.warns(UserWarning, match="TensorBoard is unavailable"):
            run = _open(cfg)
        run.log({"x": 1.0}, step=1)
        run.finish()
        return
    run = _open(cfg)
    run.log({"x": 1.0}, step=1)
    run.finish()
    assert list((tmp_path / "r" / "tensorboard").glob("events.out.tfevents.*"))
