"""W&B mirror with real offline runs: files written, config logged, run id kept across a resume, each step sent
once across relaunches, videos."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
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


def _sync_line(capsys) -> str:
    """The command in tdrl's line about an offline W&B run, from what was printed since the last call."""
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tdrl: W&B")]
    prefix = "tdrl: W&B run saved offline; upload it with: "
    assert line.startswith(prefix), line
    return line[len(prefix):]


def _offline_runs(wandb_dir):
    return sorted(p for p in wandb_dir.iterdir() if p.name.startswith("offline-run-"))


def _records(path):
    """The protobuf records of a W&B transaction log: a 7-byte header, then LevelDB log blocks of 32 KiB whose
    chunks (4-byte crc, 2-byte length, 1-byte type: 1 full, 2 first, 3 middle, 4 last) make up the records."""
    from wandb.proto import wandb_internal_pb2

    data, pos, pending, records = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0 or pos + 7 + length > len(data):  # the end, or a chunk still being written
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _logged_frames(wandb_dir, run_id):
    """The ``frames`` of every history row in every offline run of ``run_id`` (each relaunch writes one)."""
    frames = []
    for run in _offline_runs(wandb_dir):
        for record in _records(run / f"run-{run_id}.wandb"):
            if record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                if "frames" in items:  # W&B adds rows of its own (runtime at exit)
                    frames.append(json.loads(items["frames"]))
    return frames


@pytest.mark.timeout(120)
def test_offline_run_writes_files_and_keeps_its_id_across_resume(offline, tmp_path, capsys):
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
    assert _sync_line(capsys) == f"wandb sync {first}"  # tdrl's one line says how to upload it
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

    resumed = _open(Cfg(run=RunConfig(dir=str(tmp_path / "r"), seed=4, force=True)))  # relaunch the finished run
    assert resumed.wandb_id == run_id
    assert resumed.load_checkpoint() == {"i": 2}
    resumed.log({"train/return_mean": 4.0}, step=400, iteration=3)
    resumed.finish()
    runs = _offline_runs(offline)
    assert len(runs) == 2 and all(
        p.name.endswith(f"-{run_id}") or p.name.endswith(f"-{run_id}-1") for p in runs
    )
    assert all((p / f"run-{run_id}.wandb").is_file() for p in runs)
    assert _sync_line(capsys) == f"wandb sync {runs[0]} {runs[1]}"  # both launches, in the order they ran
    assert os.environ["WANDB_MODE"] == "offline"  # never rewritten by tdrl


KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    from tdrl.config import LoggerConfig, RunConfig
    from tdrl.log import Run

    run = Run.open(config={"x": 1}, run=RunConfig(dir=sys.argv[1]),
                   logger=LoggerConfig(wandb=True, progress_bar=False), name="sac")
    for itr in range(5):
        run.log({"v": float(itr)}, step=(itr + 1) * 100, iteration=itr)
        if itr == 2:
            run.save_checkpoint({"itr": itr}, itr)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    run.close(exit_code=1)  # a failed run: closed without finish (W&B's files are complete)
    """
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("end", ["close", "kill"])
def test_rows_rerun_after_a_resume_are_sent_once(offline, tmp_path, end):
    run_dir = tmp_path / "r"
    # a launch of its own, as a requeued job: not attached to this process's W&B service
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(run_dir), end], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == (-signal.SIGKILL if end == "kill" else 0), proc.stderr
    # closed: W&B's files are complete up to 500; killed: W&B's service may have lost any of them, so none is skipped
    assert (run_dir / "wandb_step.txt").is_file() == (end == "close")
    run = Run.open(config={"x": 1}, run=RunConfig(dir=str(run_dir)),
                   logger=LoggerConfig(wandb=True, progress_bar=False), name="sac")
    assert run.load_checkpoint() == {"itr": 2}
    for itr in range(3, 7):  # 400 and 500 are re-runs of rows the first launch sent
        run.log({"v": float(itr)}, step=(itr + 1) * 100, iteration=itr)
    run.finish()
    run_id = run.wandb_id
    assert len(_offline_runs(offline)) == 2
    # wandb-core may still be flushing the relaunch's records after finish() returns (a flake in CI under load)
    deadline = time.monotonic() + 20
    while not set(range(400, 800, 100)) <= set(frames := _logged_frames(offline, run_id)):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if end == "close":
        assert sorted(frames) == list(range(100, 800, 100)), frames  # every step exactly once
    else:  # what the killed launch's W&B service had not written is lost, but no re-run row is skipped
        assert set(range(400, 800, 100)) <= set(frames), frames


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
