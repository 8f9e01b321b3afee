"""User errors from the recipes' command line: one line ``error: ...``, exit status 2, no traceback unless
``TDRL_DEBUG=1``; config errors in under a second, before torch, TorchRL or any env is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.name for p in (ROOT / "recipes").glob("*.py"))
HEAVY = ("torch", "torchrl", "tensordict", "gymnasium", "mujoco", "numpy")


def run(recipe: str, *args: str, debug: bool = False, importtime: bool = False) -> tuple[subprocess.CompletedProcess,
                                                                                         float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TDRL_DEBUG": "1" if debug else "0"}
    flags = ["-X", "importtime"] if importtime else []
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *flags, str(ROOT / "recipes" / recipe), *args, "logger.wandb=false"],
                          capture_output=True, text=True, env=env, timeout=300)
    return proc, time.perf_counter() - start


def assert_one_line_error(proc: subprocess.CompletedProcess, *expected: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for text in expected:
        assert text in lines[0]


CONFIG_ERRORS = [
    ("ppo.py", ["optim.lrr=1e-3"], "did you mean 'optim.lr'"),
    ("ppo.py", ["run.seed=abc"], "config key 'run.seed': expected an int"),
    ("ppo.py", ["collector.kind=parallel", "collector.n_workers=3"], "divisible by collector.n_workers=3"),
    ("ppo.py", ["run.device=gpu"], "run.device='gpu' is not a device"),
    *[(recipe, ["collector.batch_B=0"], "config key 'collector.batch_B': 0 must be >= 1") for recipe in RECIPES],
    # found by a user: each ran (or failed with a torch traceback seconds later) before ranges were declared
    ("ppo.py", ["optim.lr=-1"], "config key 'optim.lr': -1.0 must be > 0"),
    ("ppo.py", ["optim.lr=0"], "config key 'optim.lr': 0.0 must be > 0"),
    ("a2c.py", ["loss.gamma=2"], "config key 'loss.gamma': 2.0 must be in (0, 1]"),
    ("ddpg.py", ["optim.actor_lr=-1"], "config key 'optim.actor_lr': -1.0 must be > 0"),
    ("ppo.py", ["model.hidden_sizes=[0]"], "config key 'model.hidden_sizes[0]': 0 must be >= 1"),
    ("ppo.py", ["model.hidden_sizes=[64,"], "config key 'model.hidden_sizes': '[64,' is not a list"),
]


@pytest.mark.parametrize("recipe, args, message", CONFIG_ERRORS)
def test_config_errors_are_one_line_in_under_a_second_before_torch(recipe, args, message):
    proc, seconds = run(recipe, *args)
    assert_one_line_error(proc, message)
    assert seconds < 1.0, f"{seconds:.2f} s"
    proc, _ = run(recipe, *args, importtime=True)  # which modules the failing command imported
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "tdrl" in imported and not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_debug_shows_the_traceback():
    proc, _ = run("ppo.py", "collector.batch_B=0", debug=True)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ConfigError" in proc.stderr


BUILD_ERRORS = [  # found once the env or the machine is looked at (after torch loads), still one line
    ("ppo.py", ["env.id=CartPol-v1"], "unknown environment id 'CartPol-v1'; did you mean 'CartPole-v1'"),
    ("sac.py", ["env.id=CartPole-v1"], "SAC needs a continuous (Box) action space"),
    ("dqn.py", ["env.id=Pendulum-v1"], "DQN needs a discrete action space"),
    ("td3.py", ["env.id=CartPole-v1"], "discrete"),
    ("a2c.py", ["env.id=Pendulum-v1", "model.distribution=categorical"], "does not fit this env's continuous"),
    ("ppo.py", ["trainer.kind=async"], "trainer.kind=async needs an off-policy algorithm"),
    ("ppo.py", ["trainer.kind=ddp", "trainer.world_size=512"], "trainer.world_size=512 exceeds"),
    pytest.param("a2c.py", ["run.device=cuda:7"], "run.device='cuda:7'", marks=pytest.mark.skipif(
        torch.cuda.device_count() > 7, reason="this machine has a cuda:7")),
]


@pytest.mark.parametrize("recipe, args, message", BUILD_ERRORS)
def test_build_errors_are_one_line(recipe, args, message, tmp_path):
    proc, _ = run(recipe, *args, f"run.root={tmp_path}")
    assert_one_line_error(proc, message)
    assert not list(tmp_path.rglob("progress.csv"))  # nothing ran
