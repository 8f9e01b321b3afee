"""A quiet console (tdrl/utils/console.py): a successful recipe run prints tdrl's own lines and the progress bar on
stderr, nothing else. Each recipe runs once as a user types it, with stderr a terminal (so the bar draws), no
desktop session (no ``DISPLAY``, ``XDG_RUNTIME_DIR``: ssh, a container, SLURM) and W&B as a user first gets it
(``logger.wandb=true``, offline, no ``WANDB_*`` variables): PPO with ``eval.video=true``, SAC on MuJoCo's HalfCheetah
with a worker process, IMPALA with ``trainer.kind=ray``. ``TDRL_DEBUG=1`` shows it all. A SLURM job (or a SLURM
sweep's run) calls ``main`` without the command line: it is as quiet."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shlex
import struct
import subprocess
import sys
import termios
import threading
import warnings
from pathlib import Path

import pytest

from tdrl.utils.console import HARMLESS, quiet_console
from tests.distributed.cluster import LoopbackCluster, can_make_namespaces

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["eval.n_envs=1", "eval.max_steps=10",  # and W&B at its default: logger.wandb=true, offline
          "run.torch_threads=1"]  # dqn/sac/td3 default to 2 threads: ~10x slower updates on a shared core
OFF_POLICY = ["optim.min_steps_learn=16", "model.hidden_sizes=[16]", "optim.batch_size=16", "optim.replay_ratio=16",
              "replay.size=256", "collector.total_frames=64", "logger.log_interval_steps=32"]
RUNS = {  # each recipe with a few frames, a few updates and one evaluation per log row
    "a2c": ["collector.batch_B=2", "collector.batch_T=8", "collector.total_frames=32", "logger.log_interval_steps=16"],
    "ppo": ["collector.batch_B=2", "collector.batch_T=16", "collector.total_frames=64", "logger.log_interval_steps=32",
            "loss.epochs=1", "eval.video=true", "collector.obs_norm=true"],
    "dqn": ["collector.batch_T=8", "collector.total_frames=128", "logger.log_interval_steps=64",
            "optim.min_steps_learn=32", "model.hidden_sizes=[16]", "replay.size=256", "optim.replay_ratio=8"],
    "ddpg": OFF_POLICY,
    "td3": OFF_POLICY,
    "sac": ["env.id=HalfCheetah-v5", "collector.kind=parallel", "collector.n_workers=1", "collector.batch_B=1",
            "collector.batch_T=2", "collector.total_frames=32", "logger.log_interval_steps=16",
            "optim.min_steps_learn=8", "model.hidden_sizes=[16]", "optim.batch_size=8", "optim.replay_ratio=8",
            "replay.size=100"],
    "r2d1": ["collector.batch_B=2", "collector.batch_T=10", "collector.total_frames=200",
             "logger.log_interval_steps=100", "optim.min_steps_learn=80", "model.hidden_sizes=[16]",
             "model.lstm_size=16", "model.head_sizes=[16]", "replay.size=400", "replay.warmup_T=5",
             "replay.batch_T=10", "loss.n_step=3", "optim.batch_B=4", "optim.replay_ratio=6"],
    "impala": ["trainer.kind=ray", "trainer.n_actors=2", "collector.batch_B=2", "collector.batch_T=8",
               "collector.total_frames=160", "logger.log_interval_steps=80"],
}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def foreign_lines(stderr: str, name: str) -> list[str]:
    """What ``stderr`` holds besides tdrl's own lines (``tdrl: ...``) and the progress bar: tqdm's
    ``<name>:  50%|#####     | 32.0/64 [00:01<00:01, 30.2frame/s, fps=512, ret=9]``, redrawn after a carriage
    return and erased with spaces."""
    bar = re.compile(rf"{re.escape(name)}: +\d+%\|[^|]*\| \S+/\S+ \[[^\]]*\]")
    segments = re.split(r"[\r\n]", ANSI.sub("", stderr))
    return [s for s in segments if s.strip() and not s.startswith("tdrl: ") and not bar.fullmatch(s.strip())]


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell without a desktop session, without W&B settings (``WANDB_*``) and without what
    tests/conftest.py sets to quiet the test run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k not in {
        "DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "MUJOCO_GL", "PYTHONWARNINGS",
        "TDRL_DEBUG", "RL_WARNINGS"}}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def run_on_a_terminal(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """Run ``cmd`` with stderr a terminal of 120 columns (a pseudo-terminal this side reads): exit status, stdout,
    stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    chunks: list[bytes] = []
    ended = threading.Event()

    def read() -> None:  # drained while the run goes: a full terminal buffer would block its writes
        while True:
            if not select.select([master], [], [], 0.2)[0]:
                if ended.is_set():
                    return
                continue
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # every writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env)
        os.close(slave)
        try:
            out = proc.communicate(timeout=timeout)[0].decode()
        finally:
            if proc.poll() is None:
                proc.kill()
        ended.set()
        reader.join(10)
    finally:
        os.close(master)
    return proc.returncode, out, b"".join(chunks).decode(errors="replace")


def run_recipe(name: str, run_dir: Path, *extra: str, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None,
               timeout: float = 240) -> tuple[str, dict]:
    """``python recipes/<name>.py`` with its tiny settings: the stderr it printed and its summary. W&B's files are
    named in tdrl's one line about them, on stdout."""
    cmd = [*prefix, sys.executable, str(ROOT / "recipes" / f"{name}.py"), *RUNS[name], *COMMON, *extra,
           f"run.dir={run_dir}"]
    code, out, err = run_on_a_terminal(cmd, env or user_env(), timeout)
    assert code == 0, f"exit {code}\n{out[-2000:]}\n{err[-3000:]}"
    check_wandb_line(out, run_dir)
    return err, json.loads((run_dir / "summary.json").read_text())


def check_wandb_line(stdout: str, run_dir: Path) -> None:
    """The run's offline W&B data is where tdrl's one line says, with the command that uploads it."""
    (line,) = [line for line in stdout.splitlines() if line.startswith("tdrl: W&B")]
    assert line.startswith("tdrl: W&B run saved offline; upload it with: wandb sync "), line
    (sync_dir,) = (Path(p) for p in shlex.split(line.split("wandb sync ", 1)[1]))
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    assert sync_dir.parent == run_dir / "wandb" and (sync_dir / f"run-{run_id}.wandb").is_file(), line


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [name for name in RUNS if name != "impala"])
def test_a_successful_run_prints_only_tdrl_lines_and_the_bar(name, tmp_path):
    err, summary = run_recipe(name, tmp_path / "run")
    assert not foreign_lines(err, name), err
    assert f"{name}: 100%|" in err  # the bar drew to the end
    if name == "ppo":
        assert list((tmp_path / "run" / "videos").glob("video_*.mp4"))
    if name not in ("a2c", "ppo"):
        assert summary["updates"] > 0  # the losses ran, and with them TorchRL's warnings


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_ray_run_prints_only_tdrl_lines_and_the_bar_and_ray_logs_to_the_run(tmp_path):
    """IMPALA with a Ray of its own, in a network namespace where only loopback exists (Ray binds nowhere else):
    Ray's start-up lines, its local-IP fallback there included, go to the run's debug.log."""
    if (why := can_make_namespaces()) is not None:
        pytest.skip(f"Ray loopback cluster: {why}")
    bare = LoopbackCluster(tmp_path, start=False)
    try:
        err, summary = run_recipe("impala", tmp_path / "run", prefix=("ip", "netns", "exec", bare.ns),
                                  env=user_env(**{k: v for k, v in bare.env().items() if k.startswith("RAY_")}))
    finally:
        bare.stop()
    assert not foreign_lines(err, "impala"), err
    assert summary["actors"] == 2 and summary["frames"] >= 160
    log = (tmp_path / "run" / "debug.log").read_text()
    # Ray's lines are kept beside the run's (at least its local-IP fallback: the namespace has no route out)
    assert foreign_lines(log, "impala") and "tdrl: run finished" in log, log


@pytest.mark.timeout(300)
def test_tdrl_debug_shows_everything(tmp_path):
    """The same DDPG run with ``TDRL_DEBUG=1``: TorchRL's warning about target updates is back on stderr, and W&B's
    own lines with it."""
    err, _ = run_recipe("ddpg", tmp_path / "run", env=user_env(TDRL_DEBUG="1"))
    shown = foreign_lines(err, "ddpg")
    assert any("No target network updater" in line for line in shown), err
    assert any(line.startswith("wandb: ") and "wandb sync" in line for line in shown), err


JOB_RECIPE = """
import os, subprocess, sys, warnings
from dataclasses import dataclass, field
from tdrl.config import RunConfig

@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)

def main(cfg):  # each harmless warning, here and in a child process, as a recipe's TorchRL and MuJoCo would
    emit = "; ".join(f"warnings.warn_explicit({m!r}, {c}, 'x.py', 1, module={mod!r})" for m, c, mod in HARMLESS)
    exec("import warnings; " + emit)
    subprocess.run([sys.executable, "-c", "import warnings; " + emit], check=True)
    return {"sdl": os.environ.get("SDL_VIDEODRIVER")}
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("debug", [False, True])
def test_a_slurm_job_is_as_quiet_as_the_command_line(tmp_path, debug):
    """A SLURM job (tdrl/launch/job.py, also each run of a SLURM sweep) calls the recipe's ``main`` itself: the job's
    log gets none of the harmless warnings, from the recipe or its child processes, unless ``TDRL_DEBUG=1``."""
    recipe = tmp_path / "recipes" / "warny.py"
    recipe.parent.mkdir()
    harmless = [(h.message, h.category.__name__, h.module) for h in HARMLESS]
    recipe.write_text(f"HARMLESS = {harmless!r}\n{JOB_RECIPE}")
    code = ("from tdrl.launch.job import RecipeJob;"
            f"print(RecipeJob({str(recipe)!r}, ['run.dir={tmp_path}/r'], {str(tmp_path / 'r')!r})())")
    env = user_env(**({"TDRL_DEBUG": "1"} if debug else {}))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, env=env)
    assert res.returncode == 0, res.stderr
    shown = [h.message for h in HARMLESS if h.message in res.stderr]
    if debug:
        assert res.stderr.count("Warning: ") == 2 * len(HARMLESS) and len(shown) == len(HARMLESS), res.stderr
        assert "'sdl': None" in res.stdout
    else:
        assert not res.stderr.strip(), res.stderr
        assert "'sdl': 'dummy'" in res.stdout


def test_each_filter_reaches_child_processes_and_only_its_message(monkeypatch):
    """Worker processes read the filters from ``PYTHONWARNINGS``: each harmless warning is dropped there and here,
    the same text from another module or with another start still shows."""
    monkeypatch.delenv("TDRL_DEBUG", raising=False)
    emit = "; ".join(f"warnings.warn_explicit({h.message + ' (details)'!r}, {h.category.__name__}, 'x.py', 1, "
                     f"module={module!r})" for h in HARMLESS for module in (h.module, "elsewhere"))
    with quiet_console():
        child = subprocess.run([sys.executable, "-c", f"import warnings; {emit}; "
                                "warnings.warn('another MuJoCo - compiler attribute', RuntimeWarning)"],
                               capture_output=True, text=True, timeout=60)
        with warnings.catch_warnings(record=True) as here:
            for h in HARMLESS:
                warnings.warn_explicit(h.message + " (details)", h.category, "x.py", 1, module=h.module)
    assert child.returncode == 0, child.stderr
    shown = [line for line in child.stderr.splitlines() if "Warning: " in line]
    assert len(shown) == len(HARMLESS) + 1 and all("x.py" in line for line in shown[:-1]), child.stderr
    assert not here, [str(w.message) for w in here]


def test_quiet_console_puts_the_environment_back_and_tdrl_debug_turns_it_off(monkeypatch):
    monkeypatch.delenv("TDRL_DEBUG", raising=False)
    monkeypatch.delenv("SDL_VIDEODRIVER", raising=False)
    monkeypatch.setenv("PYTHONWARNINGS", "default::ResourceWarning")
    before = dict(os.environ)
    with quiet_console():
        assert os.environ["SDL_VIDEODRIVER"] == "dummy"
        assert os.environ["PYTHONWARNINGS"].startswith("default::ResourceWarning,ignore:")
    assert dict(os.environ) == before
    monkeypatch.setenv("TDRL_DEBUG", "1")
    with quiet_console():
        assert dict(os.environ) == {**before, "TDRL_DEBUG": "1"}
