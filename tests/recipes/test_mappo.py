"""recipes/mappo.py: MAPPO and IPPO smoke runs on mpe2's simple_spread (grouped batches through TorchRL's
multi-agent losses), and bad input before anything starts."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from kill_checks import newest_state

from tdrl.config import apply_overrides
from tdrl.launch.recipe import load_recipe
from tdrl.log.progress import read_progress_floats
from tests.log.test_wandb import _records

pytest.importorskip("mpe2")

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
mappo = load_recipe(RECIPES / "mappo.py")

TINY = ["collector.batch_B=2", "collector.batch_T=25", "collector.total_frames=200", "logger.log_interval_steps=100",
        "eval.n_envs=2", "logger.wandb=false", "logger.progress_bar=false", "loss.epochs=2", "loss.minibatches=2",
        "model.hidden_sizes=[16]"]


@pytest.mark.parametrize("extra", [["loss.algorithm=mappo"], ["loss.algorithm=ippo", "env.group_map=per_agent"]],
                         ids=["mappo", "ippo-per-agent"])
def test_smoke(tmp_path, extra):
    summary = mappo.main(apply_overrides(mappo.Config(), [*TINY, f"run.root={tmp_path}", *extra]))
    assert summary["frames"] == 200 and summary["updates"] == 4 * 2 * 2  # 4 batches, 2 epochs of 2 minibatches
    assert math.isfinite(summary["eval/return_mean"])
    (progress,) = tmp_path.rglob("progress.csv")
    assert "loss/objective_mean" in progress.read_text().splitlines()[0].split(",")


def test_env_options_reach_the_env(tmp_path):
    """env.options are the env's own arguments: simple_spread with 5-step episodes (max_cycles) ends 40 episodes in
    200 frames of 2 envs, not 8."""
    summary = mappo.main(apply_overrides(mappo.Config(), [*TINY, f"run.root={tmp_path}",
                                                          "env.options=[max_cycles=5,local_ratio=0.25]"]))
    assert summary["frames"] == 200 and summary["episodes"] == 40


def test_unknown_env_exits_2_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(RECIPES / "mappo.py"), "env.id=mpe2/simple_sprd_v3",
                          f"run.root={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "unknown environment id 'mpe2/simple_sprd_v3'; mpe2 has" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.timeout(180)
def test_group_returns_in_progress_and_wandb(tmp_path, monkeypatch):
    """An env of two agent groups (simple_adversary: adversary_0; agent_0, agent_1): progress.csv and the W&B rows
    hold each group's returns beside the summed ones, and they add up to them."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run_dir = tmp_path / "run"
    mappo.main(apply_overrides(mappo.Config(), [*TINY, f"run.dir={run_dir}", "env.id=mpe2/simple_adversary_v3",
                                                "logger.wandb=true"]))
    progress = read_progress_floats(run_dir / "progress.csv")
    for section in ("train", "eval"):
        rows = [(total, adversary, agent) for total, adversary, agent in zip(
            *(progress[f"{section}/{g}return_mean"] for g in ("", "adversary/", "agent/")), strict=True)
            if math.isfinite(total)]
        assert len(rows) >= 2 and all(adv + agent == pytest.approx(total) for total, adv, agent in rows)
    expected = [v for v in progress["train/agent/return_mean"] if math.isfinite(v)]
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    deadline = time.monotonic() + 20  # wandb-core may still be writing its log after the run finished
    while (logged := _wandb_values(offline, "train/agent/return_mean")) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert logged == expected


def _wandb_values(offline_run: Path, key: str) -> list[float]:
    """``key``'s values in the history rows of a W&B offline run's log."""
    rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for record in _records(next(offline_run.glob("run-*.wandb")))
            if record.WhichOneof("record_type") == "history"]
    return [row[key] for row in rows if key in row]


def _actor_params(run_dir: Path, group: str) -> dict[str, torch.Tensor]:
    """The group's actor parameters in the run's newest checkpoint."""
    model = newest_state(run_dir)["state"]["model"]
    return {k: v for k, v in model.items() if k.startswith(f"{group}.actor_network_params")}


@pytest.mark.timeout(180)
def test_per_group_optimizers_and_a_frozen_group(tmp_path):
    """simple_adversary with one Adam per group (a checkpointed updater each) and the adversary frozen: its actor
    ends as it started (the same in a run twice as long) while the agents' actor learns; per-group gradient norms
    reach the log."""
    args = [*TINY, "env.id=mpe2/simple_adversary_v3", "optim.per_group=true"]
    for frames in (100, 200):
        mappo.main(apply_overrides(mappo.Config(), [*args, "optim.frozen_groups=[adversary]",
                                                    f"run.dir={tmp_path / str(frames)}",
                                                    f"collector.total_frames={frames}"]))
    mappo.main(apply_overrides(mappo.Config(), [*args, f"run.dir={tmp_path / 'none'}"]))
    state = newest_state(tmp_path / "200")["state"]
    assert {"updater_agent"} <= state.keys() and "updater_adversary" not in state and "updater" not in state
    short, long, unfrozen = (_actor_params(tmp_path / d, "adversary") for d in ("100", "200", "none"))
    assert short and all(torch.equal(short[k], long[k]) for k in short)
    assert any(not torch.equal(short[k], unfrozen[k]) for k in short)  # trained when not frozen
    agent_short, agent_long = (_actor_params(tmp_path / d, "agent") for d in ("100", "200"))
    assert any(not torch.equal(agent_short[k], agent_long[k]) for k in agent_short)
    header = (tmp_path / "200" / "progress.csv").read_text().splitlines()[0].split(",")
    assert any(c.startswith("train/grad_norm_agent") for c in header), header



def test_freezing_every_group_is_refused():
    from tdrl.utils.errors import UserError

    assert mappo.trained_groups(["adversary", "agent"], ["agent"]) == ["adversary"]
    with pytest.raises(UserError, match=r"freezes every agent group \(\['adversary', 'agent'\]\): nothing would learn"):
        mappo.trained_groups(["adversary", "agent"], ["agent", "adversary"])
