"""recipes/maddpg.py: MADDPG and MASAC smoke runs on mpe2's simple_spread with continuous actions, the critics'
visibility lists (what each agent's critic reads), the agent mask in both losses, and bad input before anything
starts."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Unbounded

from tdrl.config import ConfigError, apply_overrides
from tdrl.launch.recipe import load_recipe
from tdrl.log.progress import read_progress_floats

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")  # the recipe's TargetUpdate does it

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
maddpg = load_recipe(RECIPES / "maddpg.py")

TINY = ["collector.batch_B=2", "collector.batch_T=25", "collector.total_frames=200", "logger.log_interval_steps=100",
        "eval.n_envs=2", "logger.wandb=false", "logger.progress_bar=false", "model.hidden_sizes=[16]",
        "optim.batch_size=32", "optim.replay_ratio=16", "optim.min_steps_learn=50", "replay.size=1000",
        "exploration.sigma_frames=100"]
N_AGENTS, OBS, ACT = 3, 4, 2


def tiny(tmp_path: Path, *extra: str):
    return apply_overrides(maddpg.Config(), [*TINY, f"run.root={tmp_path}", *extra])


@pytest.mark.parametrize("algorithm", ["maddpg", "masac"])
def test_smoke_on_simple_spread(tmp_path, algorithm):
    pytest.importorskip("mpe2")
    summary = maddpg.main(tiny(tmp_path, f"loss.algorithm={algorithm}",
                               "model.critic_visible_agents=[[0,1],[1,2],[2,0]]"))
    # 4 batches of 50 frames, the first before learning starts: 3 x 50 x 16 / 32 updates
    assert summary["frames"] == 200 and summary["updates"] == 75
    assert math.isfinite(summary["eval/return_mean"])
    (progress,) = tmp_path.rglob("progress.csv")
    columns = progress.read_text().splitlines()[0].split(",")
    assert {"loss/actor_mean", "loss/qvalue_mean"} <= set(columns)
    assert ("loss/alpha_mean" in columns) == (algorithm == "masac")


def test_masac_on_a_vmas_scenario(tmp_path):
    """VMAS's sampling (3 agents, 100-step episodes) stepped as one batched torch env (collector.kind=batched_env)."""
    pytest.importorskip("vmas")
    summary = maddpg.main(tiny(tmp_path, "env.id=vmas/sampling", "collector.kind=batched_env", "loss.algorithm=masac",
                               "eval.max_steps=25"))
    assert summary["frames"] == 200 and summary["updates"] == 75 and math.isfinite(summary["eval/return_mean"])


# --- The model and the losses, on specs of 3 agents --------------------------------------------------------------
def _parts(algorithm: str, visible, *extra: str):
    cfg = apply_overrides(maddpg.Config(), [f"loss.algorithm={algorithm}", "model.hidden_sizes=[8]", *extra])
    obs = Unbounded(shape=(N_AGENTS, OBS))
    act = Bounded(0.0, 1.0, shape=(N_AGENTS, ACT))
    torch.manual_seed(0)
    actor = maddpg.group_actor(obs, act, cfg.model, algorithm == "masac")
    critic = maddpg.group_critic(obs, act, maddpg.visible_agents(visible, N_AGENTS), cfg.model)
    return actor, critic, maddpg.group_loss(cfg, actor, critic, act)


def _batch(n: int = 16, seed: int = 1) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    agents = {"observation": torch.randn(n, N_AGENTS, OBS, generator=g), "mask": torch.ones(n, N_AGENTS, dtype=bool)}
    later = {**agents, "observation": torch.randn(n, N_AGENTS, OBS, generator=g),
             "reward": torch.randn(n, N_AGENTS, 1, generator=g), "done": torch.zeros(n, N_AGENTS, 1, dtype=bool),
             "terminated": torch.zeros(n, N_AGENTS, 1, dtype=bool)}
    td = TensorDict({"agents": {**agents, "action": torch.rand(n, N_AGENTS, ACT, generator=g)},
                     "next": {"agents": later}}, batch_size=[n])
    td["agents"].batch_size = td["next", "agents"].batch_size = [n, N_AGENTS]
    return td


@pytest.mark.parametrize("share", ["true", "false"])
@pytest.mark.parametrize("visible, width", [(None, 3), ([[0], [1], [2]], 1), ([[0, 1], [1, 2], [2, 0]], 2),
                                            ([[0, 1, 2], [1], [2, 0]], 3)])
def test_visibility_lists_shape_the_critics_input(visible, width, share):
    _, critic, _ = _parts("maddpg", visible, f"model.share_critic_params={share}")
    assert critic.module.in_features == width * (OBS + ACT)
    seen = maddpg.visible_agents(visible, N_AGENTS)
    td = _batch()
    q = critic(td.clone())["agents", "state_action_value"]
    for j in range(N_AGENTS):  # changing agent j's observation and action changes the Q of the critics that see j
        changed = td.clone()
        changed["agents", "observation"][:, j] += 1.0
        changed["agents", "action"][:, j] = 1 - changed["agents", "action"][:, j]
        moved = (critic(changed)["agents", "state_action_value"] - q).abs().amax(dim=(0, 2)) > 1e-6
        assert moved.tolist() == [j in seen[i] for i in range(N_AGENTS)], (visible, j)


@pytest.mark.parametrize("visible, share, one_view", [(None, "true", True), ([[1, 2]] * 3, "true", True),
                                                     (None, "false", False), ([[0, 1], [1, 2], [2, 0]], "true", False)])
def test_one_shared_view_is_computed_once(visible, share, one_view):
    """Agents that all see the same agents through shared parameters get one Q, computed once (BenchMARL's
    centralised critic); the MASAC loss trains through it."""
    _, critic, loss = _parts("masac", visible, f"model.share_critic_params={share}")
    assert critic.module.one_view == one_view
    q = critic(_batch())["agents", "state_action_value"]
    assert q.shape == (16, N_AGENTS, 1) and torch.equal(q[:, 0], q[:, 2]) == one_view
    total, *grads = _loss_and_gradient(loss, _batch())
    assert torch.isfinite(total) and any(g is not None and g.abs().sum() > 0 for g in grads)


def _loss_and_gradient(loss, td):
    torch.manual_seed(2)  # MASAC samples actions: the same draws for each batch compared
    terms = loss(td.clone())
    total = sum(value for key, value in terms.items() if key.startswith("loss_"))
    params = [p for p in loss.parameters() if p.requires_grad]
    return [total.detach(), *torch.autograd.grad(total, params, allow_unused=True)]


@pytest.mark.parametrize("algorithm", ["maddpg", "masac"])
def test_an_absent_agents_rows_do_not_train(algorithm):
    """Agent 1 is absent ((agents, "mask") False): scrambling its observation, action, reward and next observation
    changes no loss and no gradient (independent critics, so no other agent reads its rows); while it is present,
    the same scramble changes them."""
    *_, loss = _parts(algorithm, [[0], [1], [2]])
    td = _batch()
    scrambled = td.clone()
    scrambled["agents", "observation"][:, 1] += 5.0
    scrambled["agents", "action"][:, 1] = 1 - scrambled["agents", "action"][:, 1]
    scrambled["next", "agents", "observation"][:, 1] -= 5.0
    scrambled["next", "agents", "reward"][:, 1] += 100.0
    present = [_loss_and_gradient(loss, batch) for batch in (td, scrambled)]
    assert not all(torch.equal(a, b) for a, b in zip(*present, strict=True) if a is not None)
    for batch in (td, scrambled):
        batch["agents", "mask"][:, 1] = False
    absent = [_loss_and_gradient(loss, batch) for batch in (td, scrambled)]
    for a, b in zip(*absent, strict=True):
        assert (a is None and b is None) or torch.allclose(a, b, atol=1e-6)


# --- Bad input ----------------------------------------------------------------------------------------------------
def test_a_discrete_env_exits_2_with_one_line(tmp_path):
    pytest.importorskip("mpe2")
    out = subprocess.run([sys.executable, str(RECIPES / "maddpg.py"), "env.continuous_actions=false",
                          f"run.root={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "env.id='mpe2/simple_spread_v3' has discrete actions; MADDPG needs continuous ones" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("lists, message", [
    ("[[0,1],[1,2]]", r"model.critic_visible_agents has 2 lists; the env has 3 agents"),
    ("[[0,1],[1,3],[2]]", r"model.critic_visible_agents\[1\]=\[1, 3\]: name each agent at most once"),
    ("[[0,0],[1],[2]]", r"model.critic_visible_agents\[0\]=\[0, 0\]"),
    ("[[0],[],[2]]", r"model.critic_visible_agents\[1\]=\[\]")])
def test_bad_visibility_lists_are_config_errors_before_anything_is_written(tmp_path, lists, message):
    pytest.importorskip("mpe2")
    with pytest.raises(ConfigError, match=message):
        maddpg.main(tiny(tmp_path, f"model.critic_visible_agents={lists}"))
    assert not list(tmp_path.iterdir())


def test_help_and_n_step(tmp_path):
    out = subprocess.run([sys.executable, str(RECIPES / "maddpg.py"), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "model.critic_visible_agents" in out.stdout and "loss.algorithm" in out.stdout
    with pytest.raises(ConfigError, match="loss.n_step=3: the replay sums n-step returns of the team reward"):
        tiny(tmp_path, "loss.n_step=3")


# --- Learning -----------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("algorithm, above", [("maddpg", -62.0), ("masac", -62.0)])
def test_learns_simple_spread(tmp_path, algorithm, above):
    """The defaults, seed 0, 100k frames (recipes/maddpg.py's docstring has the curves): the greedy return of the
    last three evaluations averages above ``above``, where the untrained actors, holding every agent still, score
    -67 (summed over the agents) and noisy random play about -75."""
    pytest.importorskip("mpe2")
    cfg = apply_overrides(maddpg.Config(), [f"run.root={tmp_path}", f"loss.algorithm={algorithm}",
                                            "collector.total_frames=100000", "logger.wandb=false",
                                            "logger.progress_bar=false"])
    maddpg.main(cfg)
    (progress,) = tmp_path.rglob("progress.csv")
    returns = read_progress_floats(progress)["eval/return_mean"]
    assert len(returns) == 11 and sum(returns[-3:]) / 3 > above, returns
