"""Run directory: layout, config files, debug.log, resume rules, bad input, summary."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tdrl.ckpt import CheckpointCorrupt, CheckpointError, CheckpointWarning
from tdrl.config import CheckpointConfig, ConfigError, LoggerConfig, RunConfig, apply_overrides
from tdrl.log import Run, RunDirError, read_progress


@dataclass
class OptimConfig:
    lr: float = 1e-3
    batch_size: int = 64


@dataclass
class Cfg:
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(
        default_factory=lambda: LoggerConfig(wandb=False, progress_bar=False)
    )
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def _open(cfg: Cfg, **kw) -> Run:
    return Run.open(
        config=cfg, run=cfg.run, logger=cfg.logger, checkpoint=cfg.checkpoint, name="ppo", **kw
    )


def test_new_run_directory_layout_and_files(tmp_path, capsys):
    cfg = apply_overrides(Cfg(), {"run.root": str(tmp_path / "runs"), "run.seed": 3})
    run = _open(cfg)
    rel = run.dir.relative_to(tmp_path / "runs")
    assert re.fullmatch(r"\d{8}/\d{6}_ppo/run_3", rel.as_posix()), rel
    assert not run.resumed
    assert str(run.dir) in capsys.readouterr().out  # the path is printed at start
    saved = json.loads((run.dir / "config.json").read_text())
    assert saved["optim"] == {"lr": 1e-3, "batch_size": 64} and saved["run"]["seed"] == 3
    params = json.loads((run.dir / "params.json").read_text())
    assert params["name"] == "ppo" and params["run_ID"] == 3 and params["optim"]["lr"] == 1e-3
    print("hello from the training loop")
    print("a warning-ish line", file=sys.stderr)
    run.log({"train/return_mean": 1.5}, step=10, iteration=0)
    second = _open(cfg)  # same second, same name and seed: a fresh directory, never a resume
    assert second.dir != run.dir and not second.resumed
    second.finish()
    summary = run.finish({"eval/return_mean": torch.tensor(2.5), "extra": 1})
    assert summary == {
        "frames": 10,
        "wall_s": summary["wall_s"],
        "eval/return_mean": 2.5,
        "extra": 1,
    }
    assert json.loads((run.dir / "summary.json").read_text()) == summary
    assert run.finish() is summary  # idempotent
    log = (run.dir / "debug.log").read_text()
    assert (
        "hello from the training loop" in log and "a warning-ish line" in log and "frames 10" in log
    )
    print("after finish")
    assert "after finish" not in (run.dir / "debug.log").read_text()  # the tee is gone
    assert type(sys.stdout).__name__ != "_TeeStream" and type(sys.stderr).__name__ != "_TeeStream"


def test_summary_takes_last_logged_eval_return(tmp_path):
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})
    with _open(cfg) as run:
        run.log({"eval/return_mean": 7.0}, step=5)
        run.log({"train/return_mean": 1.0}, step=9)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["frames"] == 9 and summary["eval/return_mean"] == 7.0 and summary["wall_s"] > 0


def test_failed_run_closes_without_summary(tmp_path):
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})
    with pytest.raises(RuntimeError, match="boom"), _open(cfg) as run:
        run.log({"x": 1.0}, step=1)
        raise RuntimeError("boom")
    assert not (tmp_path / "r" / "summary.json").exists()


def test_resume_with_different_config_lists_keys_unless_forced(tmp_path):
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})
    _open(cfg).finish()
    changed = apply_overrides(
        cfg, {"optim.lr": 3e-4, "optim.batch_size": 128, "logger.progress_bar": True}
    )
    with pytest.raises(ConfigError) as err:
        _open(changed)
    message = str(err.value)
    assert "optim.lr: saved 0.001, now 0.0003" in message
    assert "optim.batch_size: saved 64, now 128" in message
    assert "logger.progress_bar" not in message  # how a run is watched may change
    assert "run.force=true" in message
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["optim"]["lr"] == 1e-3  # nothing lost
    forced = apply_overrides(changed, {"run.force": True})
    with pytest.warns(UserWarning, match="optim.lr"):
        run = _open(forced)
    assert run.resumed
    run.finish()
    assert json.loads((tmp_path / "r" / "config.json").read_text())["optim"]["lr"] == 3e-4
    (before,) = (tmp_path / "r").glob("config.before-*.json")
    assert json.loads(before.read_text())["optim"]["lr"] == 1e-3


def test_resume_across_an_upgrade_takes_new_keys_at_their_defaults(tmp_path, capsys):
    """A run saved by a tdrl without a key resumes when the key is at the recipe's default (a sweep relaunched after
    an upgrade), with one line naming it; set to anything else, the key is a difference like any other. A key the
    recipe no longer has (a trainer key of a kind it does not wire up) is named and does not count."""
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})
    _open(cfg).close()  # interrupted: a finished run is not relaunched
    config_json = tmp_path / "r" / "config.json"
    saved = json.loads(config_json.read_text())
    del saved["optim"]["batch_size"]  # as an older tdrl wrote it
    saved["optim"]["n_actors"] = 4
    config_json.write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=r"optim.batch_size: saved <absent>, now 128"):
        _open(apply_overrides(cfg, {"optim.batch_size": 128}))
    run = _open(cfg)
    assert run.resumed
    run.finish()
    err = capsys.readouterr().err
    assert "tdrl: resuming with keys added since this run started, at their defaults: optim.batch_size=64" in err
    assert "tdrl: resuming without keys this recipe no longer has: optim.n_actors=4" in err
    assert json.loads(config_json.read_text())["optim"]["batch_size"] == 64  # saved from now on


def test_resume_restores_rng_position_and_truncates_rows(tmp_path):
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})
    run = _open(cfg)
    for itr in range(3):
        run.log({"v": float(itr)}, step=(itr + 1) * 10, iteration=itr)
        if itr == 1:
            run.save_checkpoint({"itr": itr, "w": torch.ones(2)}, itr)
            after_ckpt = torch.rand(4)
    run.close()  # "killed": row 2 was written after the checkpoint
    torch.rand(100)
    run = _open(cfg)
    assert run.resumed
    state = run.load_checkpoint()
    assert state["itr"] == 1 and torch.equal(state["w"], torch.ones(2))
    # torch RNG continues where the checkpoint was taken
    assert torch.equal(torch.rand(4), after_ckpt)
    assert run.last_checkpoint.iteration == 1
    row = run.log({"v": 2.0}, step=30, iteration=2)
    assert row == {"Iteration": 2, "CumSteps": 30, "v": 2.0}
    run.finish()
    header, rows = read_progress(tmp_path / "r" / "progress.csv")
    assert [r["Iteration"] for r in rows] == ["0", "1", "2"]


def test_resume_without_checkpoint_starts_over(tmp_path):
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})
    run = _open(cfg)
    run.log({"v": 1.0}, step=10, iteration=0)
    run.close()  # killed before any checkpoint
    run = _open(cfg)
    assert run.load_checkpoint() is None
    run.log({"v": 1.0}, step=10, iteration=0)
    run.finish()
    assert len(read_progress(tmp_path / "r" / "progress.csv")[1]) == 1


def test_logging_on_resumed_run_before_load_warns_and_starts_over(tmp_path):
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})
    run = _open(cfg)
    run.log({"v": 1.0}, step=10)
    run.save_checkpoint({}, 0)
    run.close()
    run = _open(cfg)
    with pytest.warns(UserWarning, match="before load_checkpoint"):
        run.log({"v": 1.0}, step=10)
    run.finish()
    assert len(read_progress(tmp_path / "r" / "progress.csv")[1]) == 1


def test_a_live_run_directory_cannot_be_opened_twice(tmp_path):
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})
    first = _open(cfg)
    holder = rf"pid {os.getpid()} on host {re.escape(socket.gethostname())} since"
    with pytest.raises(RunDirError, match=rf"in use by another process \({holder}"):
        _open(cfg)
    assert first.log({"x": 1.0}, step=1)["CumSteps"] == 1  # the failed open changed nothing
    first.close()
    second = _open(cfg)  # released on close (and by the kernel when a process dies, see tests/ckpt)
    second.close()


def test_snapshot_mode_none_writes_nothing(tmp_path):
    cfg = apply_overrides(
        Cfg(), {"run.dir": str(tmp_path / "r"), "checkpoint.snapshot_mode": "none"}
    )
    run = _open(cfg)
    assert run.save_checkpoint({"x": 1}, 0) is None
    assert run.load_checkpoint() is None
    run.finish()
    assert list((tmp_path / "r" / "checkpoints").iterdir()) == []


def _readonly(path: Path) -> bool:
    """Make ``path`` a read-only directory: chmod for normal users, a read-only tmpfs for root."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        return True
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True
    )
    return result.returncode == 0


def test_unwritable_run_dir_is_a_clear_error_at_start(tmp_path):
    ro = tmp_path / "ro"
    if not _readonly(ro):
        pytest.skip("cannot make a read-only directory here")
    try:
        with pytest.raises(
            RunDirError, match=r"(Read-only file system|Permission denied).*run\.root or run\.dir"
        ):
            _open(apply_overrides(Cfg(), {"run.root": str(ro)}))
        with pytest.raises(RunDirError, match="cannot create run directory"):
            _open(apply_overrides(Cfg(), {"run.dir": str(ro / "x")}))
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)], check=False)
        else:
            ro.chmod(0o755)


def test_full_disk_at_checkpoint_time_keeps_previous_and_names_cause(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True
        ).returncode
    ):
        pytest.skip("needs root and tmpfs (tests/ckpt covers the non-root RLIMIT_FSIZE variant)")
    try:
        cfg = apply_overrides(Cfg(), {"run.dir": str(mnt / "r")})
        run = _open(cfg)
        run.log({"v": 1.0}, step=1)
        run.save_checkpoint({"w": torch.zeros(10)}, 0)
        with pytest.raises(CheckpointError, match=r"disk full.*itr_00000000 is intact"):
            run.save_checkpoint({"w": torch.zeros(2_000_000)}, 1)
        run.close()
        run = _open(cfg)
        assert run.load_checkpoint()["w"].shape == (10,)
        run.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _flip_byte(checkpoint: Path) -> None:
    state = checkpoint / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01
    state.write_bytes(bytes(data))


def _run_with_checkpoints(cfg: Cfg, n: int) -> Path:
    """A run that logged a row and saved a checkpoint at iterations 0..n-1, then a row past the last one."""
    run = _open(cfg)
    for itr in range(n):
        run.log({"v": float(itr)}, step=(itr + 1) * 10, iteration=itr)
        run.save_checkpoint({"itr": itr}, itr)
    run.log({"v": float(n)}, step=(n + 1) * 10, iteration=n)
    run.close()  # killed
    return run.dir


def test_corrupt_newest_checkpoint_resumes_from_the_one_before(tmp_path):
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})  # default snapshot mode
    run_dir = _run_with_checkpoints(cfg, 3)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["itr_00000001", "itr_00000002"]
    _flip_byte(run_dir / "checkpoints" / "itr_00000002")
    run = _open(cfg)
    with pytest.warns(CheckpointWarning, match=r"itr_00000002: file state.pt sha256"):
        assert run.load_checkpoint() == {"itr": 1}
    assert [r["Iteration"] for r in read_progress(run_dir / "progress.csv")[1]] == ["0", "1"]
    run.close()


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every file and directory under ``root``: kind, size, mtime and the sha256 of files."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        out[path.relative_to(root).as_posix()] = (path.is_dir(), st.st_size, st.st_mtime_ns, digest)
    out["."] = (True, root.stat().st_size, root.stat().st_mtime_ns, None)
    return out


@pytest.mark.timeout(120)
def test_no_loadable_checkpoint_stops_and_changes_nothing_unless_forced(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)  # W&B files go into the run directory
    logger = LoggerConfig(wandb=True, progress_bar=False)
    cfg = apply_overrides(Cfg(logger=logger), {"run.dir": str(tmp_path / "r")})
    run_dir = _run_with_checkpoints(cfg, 2)
    for checkpoint in (run_dir / "checkpoints").iterdir():
        _flip_byte(checkpoint)
    before = _snapshot(run_dir)
    expected = {"debug.log", "progress.csv", "config.json", "params.json", ".lock", "wandb_id.txt", "wandb"}
    assert expected <= before.keys()
    with pytest.raises(RunDirError) as err:
        _open(cfg)
    message = str(err.value)
    assert "\n" not in message and "run.force=true" in message and "3 progress rows" in message
    assert "itr_00000001: file state.pt sha256" in message and "itr_00000000: file state.pt sha256" in message
    assert _snapshot(run_dir) == before  # byte for byte, mtimes included

    forced = apply_overrides(cfg, {"run.force": True})
    run = _open(forced)
    with pytest.warns(CheckpointWarning, match="CORRUPT"):
        assert run.load_checkpoint() is None
    assert not list((run_dir / "checkpoints").glob("itr_*"))
    assert len(list((run_dir / "checkpoints" / "corrupt").iterdir())) == 2
    assert read_progress(run_dir / "progress.csv")[1] == []  # started over
    run.log({"v": 0.0}, step=10, iteration=0)
    run.finish()


def test_strict_resume_refuses_a_corrupt_newest_before_writing(tmp_path):
    cfg = apply_overrides(Cfg(), {"run.dir": str(tmp_path / "r")})
    run_dir = _run_with_checkpoints(cfg, 2)
    _flip_byte(run_dir / "checkpoints" / "itr_00000001")
    before = _snapshot(run_dir)
    with pytest.raises(CheckpointCorrupt, match=r"itr_00000001.*strict_resume=true"):
        _open(apply_overrides(cfg, {"checkpoint.strict_resume": True}))
    assert _snapshot(run_dir) == before
