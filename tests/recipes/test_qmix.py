"""recipes/qmix.py: QMIX, VDN and IQL smoke runs on mpe2's simple_spread (grouped transitions through the replay),
the climbing game's greedy joint action after uniform exploration, and bad input before anything starts."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdrl.config import apply_overrides
from tdrl.envs.matrix_games import CLIMBING, MatrixGameParallel
from tdrl.envs.multiagent import GroupedEnv
from tdrl.launch.recipe import load_recipe
from tdrl.objectives import value_decomposition

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")  # the recipe's TargetUpdate does it

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
qmix = load_recipe(RECIPES / "qmix.py")

TINY = ["collector.batch_B=2", "collector.batch_T=25", "collector.total_frames=200", "logger.log_interval_steps=100",
        "eval.n_envs=2", "logger.wandb=false", "logger.progress_bar=false", "model.hidden_sizes=[16]",
        "model.mixing_embed_dim=8", "optim.batch_size=32", "optim.replay_ratio=16", "optim.min_steps_learn=50",
        "optim.target_update_interval=4", "replay.size=1000", "exploration.eps_steps=100"]


def tiny(tmp_path: Path, *extra: str):
    return apply_overrides(qmix.Config(), [*TINY, f"run.root={tmp_path}", *extra])


@pytest.mark.parametrize(("method", "double_q"), [("qmix", False), ("qmix", True), ("vdn", False), ("iql", True)])
def test_smoke_on_simple_spread(tmp_path, method, double_q):
    pytest.importorskip("mpe2")
    summary = qmix.main(tiny(tmp_path, f"loss.method={method}", f"loss.double_q={str(double_q).lower()}"))
    # 4 batches of 50 frames, the first before learning starts: 3 x 50 x 16 / 32 updates
    assert summary["frames"] == 200 and summary["updates"] == 75
    assert math.isfinite(summary["eval/return_mean"])
    (progress,) = tmp_path.rglob("progress.csv")
    assert "loss/q_mean" in progress.read_text().splitlines()[0].split(",")


def grouped_climbing():
    return GroupedEnv(MatrixGameParallel(CLIMBING), group_map="one_group")


@pytest.mark.parametrize("method", ["qmix", "vdn", "iql"])
def test_uniform_play_of_the_climbing_game_learns_the_factorized_fit(tmp_path, method, monkeypatch):
    """Epsilon 1 throughout: every joint action equally often, as in tests/objectives/test_matrix_games.py, whose
    hand-computed fits pick (2, 2) -> 5 for IQL and VDN and (2, 2) or (1, 2) for QMIX, not the optimum (0, 0) -> 11."""
    built, make_group_q = [], value_decomposition.make_group_q

    def recorded(*args, **kwargs):  # the recipe's Q-network, to read its greedy joint action after training
        built.append(make_group_q(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(value_decomposition, "make_group_q", recorded)
    cfg = apply_overrides(qmix.Config(), [
        f"run.root={tmp_path}", f"loss.method={method}", "eval.n_envs=0", "logger.wandb=false",
        "logger.progress_bar=false", "collector.batch_B=8", "collector.batch_T=16", "collector.total_frames=1280",
        "logger.log_interval_steps=1280", "exploration.eps_final=1.0", "optim.lr=3e-2", "optim.batch_size=256",
        "optim.replay_ratio=60", "optim.min_steps_learn=128", "model.hidden_sizes=[64]", "replay.size=2048"])
    summary = qmix.main(cfg, env_factory=grouped_climbing)
    assert summary["updates"] == 270
    (q,) = built
    with torch.no_grad():
        td = q(TensorDict({("agents", "observation"): torch.eye(2).unsqueeze(0)}, batch_size=[1]))
    greedy = tuple(td["agents", "action"][0].tolist())
    assert greedy in ({(2, 2), (1, 2)} if method == "qmix" else {(2, 2)}), f"{method}: {greedy}"


def test_help_and_bad_input_exit_2_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(RECIPES / "qmix.py"), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "loss.method" in out.stdout and "exploration.eps_steps" in out.stdout
    out = subprocess.run([sys.executable, str(RECIPES / "qmix.py"), "loss.method=iql", "loss.n_step=3",
                          f"run.root={tmp_path}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "loss.n_step=3 with loss.method=iql" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
