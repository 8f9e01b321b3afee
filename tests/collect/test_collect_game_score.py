"""Games that outlast episodes (rlpyt's ``traj_done``, Atari's episodic lives): every collector kind ends the
agent's episode at each lost life (done, ``is_init`` after it, a new traj id) but a TrajInfo only at game over, so
``Return``/``GameScore`` are the game's; a game in progress resumes exactly; evaluation refuses episodic lives.

``LivesEnv`` games (3 lives of 4 steps, step ``k`` pays ``k``) make every number exact; a real ``ALE/Breakout-v5``
with :class:`tdrl.envs.atari.EpisodicLives` checks the contract with the env that reports it.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from collect_helpers import ConstantAction, LivesFactory
from tensordict.nn import TensorDictModule

from tdrl.collect import make_collector, make_eval_collector
from tdrl.collect.stepping import env_seed
from tdrl.envs import EnvFactory

GAME = LivesFactory(lives=3, life_length=4)
GAME_LENGTH = 12
GAME_RETURN = GAME_LENGTH * (GAME_LENGTH + 1) / 2
DISCOUNT = 0.9
KINDS = ["serial", "parallel", "action_server", "alternating"]


def build(kind, reset_mode="reset_at_once", factory=GAME, batch_T=5):
    policy = TensorDictModule(ConstantAction(1), ["observation"], ["action"])
    return make_collector(kind, factory, policy, batch_B=2, batch_T=batch_T, n_workers=1 if kind == "alternating"
                          else 2, seed=0, reset_mode=reset_mode, discount=DISCOUNT)


def game_info(length=GAME_LENGTH):
    rewards = np.arange(1, length + 1, dtype=np.float64)
    ret = float(rewards.sum())
    return {"Length": length, "Return": ret, "NonzeroRewards": length,
            "DiscountedReturn": float((rewards * DISCOUNT ** np.arange(length)).sum()), "GameScore": ret}


def valid_steps(batches, env, key):
    """``key`` of env ``env`` along the valid (unmasked) steps of consecutive batches."""
    return torch.cat([b[key][env][b["collector", "mask"][env]].reshape(-1) for b in batches])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reset_mode", ["reset_at_once", "wait_reset"])
@pytest.mark.parametrize("kind", KINDS)
def test_traj_info_spans_the_game_the_agent_sees_each_life(kind, reset_mode):
    with build(kind, reset_mode) as collector:
        batches, infos = [], []
        for _ in range(6):  # 30 steps per env (wait-reset: 4 valid steps per 5): 2 games each
            batches.append(collector.collect().clone())
            infos += collector.traj_infos
    assert len(infos) == 4
    for info in infos:
        assert info == pytest.approx(game_info())
    for env in range(2):
        steps = valid_steps(batches, env, ("next", "done"))
        assert len(steps) >= 2 * GAME_LENGTH
        lives_end = (torch.arange(len(steps)) + 1) % GAME.life_length == 0
        assert torch.equal(steps, lives_end), "the agent's episode ends at every lost life"
        starts = valid_steps(batches, env, "is_init")
        assert torch.equal(starts, torch.arange(len(steps)) % GAME.life_length == 0)
        ids = valid_steps(batches, env, ("collector", "traj_ids"))
        assert torch.equal(ids[1:] != ids[:-1], steps[:-1]), "one traj id per life"
        rewards = valid_steps(batches, env, ("next", "reward"))
        assert torch.equal(rewards, (torch.arange(len(steps)) % GAME_LENGTH + 1).float())


def through_torch_save(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def per_batch_infos(collector, n):
    out = []
    for _ in range(n):
        collector.collect()
        out.append(collector.traj_infos)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_game_in_progress_resumes_exactly(kind):
    """Saved 5 steps into a game (a life already lost): the resumed collector ends that game in the same batch with
    the whole game's sums, as the uninterrupted one does."""
    with build(kind) as collector:
        collector.collect()
        state = through_torch_save(collector.state_dict())
        expected = per_batch_infos(collector, 3)
    assert [len(infos) for infos in expected] == [0, 2, 0]  # the game ends at its step 12: step 2 of batch 3
    assert expected[1] == [pytest.approx(game_info())] * 2
    sums = [s["envs"]["episodes"] for s in state["engine"]["slices"]]
    assert [int(length) for s in sums for length in s["length"]] == [5, 5]
    with build(kind) as resumed:
        resumed.load_state_dict(state)
        assert per_batch_infos(resumed, 3) == expected


def test_decorrelation_steps_count_toward_the_game():
    """Random decorrelation steps that lose a life do not end the game's TrajInfo: its first one is a whole game."""
    counts = [int(np.random.default_rng(env_seed(0, i)).integers(0, GAME_LENGTH)) for i in range(2)]
    assert max(counts) >= GAME.life_length, "a life is lost during decorrelation"
    policy = TensorDictModule(ConstantAction(1), ["observation"], ["action"])
    with make_collector("serial", GAME, policy, batch_B=2, batch_T=GAME_LENGTH, seed=0, discount=DISCOUNT,
                        max_decorrelation_steps=GAME_LENGTH - 1) as collector:
        collector.collect()
        assert collector.traj_infos == [pytest.approx(game_info())] * 2


def test_evaluation_refuses_episodic_lives():
    with pytest.raises(ValueError, match="evaluation plays whole games"):
        make_eval_collector("ALE/Breakout-v5", None, n_envs=1, seed=0, env_kwargs={"episodic_lives": True})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_breakout_game_score_spans_five_lives(kind):
    """Random Breakout play with episodic lives: the agent sees a done at each of the 5 lives; the TrajInfos are
    exactly the games (every 5th done), with the summed reward of all 5 lives."""
    pytest.importorskip("ale_py", reason="needs ale-py: pip install 'tdrl[atari]'")
    factory = EnvFactory("ALE/Breakout-v5", {"episodic_lives": True, "repeat_action_probability": 0.0})
    batches, infos = [], []
    with make_collector(kind, factory, None, batch_B=2, batch_T=128, seed=0, discount=DISCOUNT) as collector:
        while len(batches) < 40 and min(int(d.sum()) for d in done_rows(batches)) < 5:
            batches.append(collector.collect().clone())
            infos += collector.traj_infos
    games = []
    for env, done in enumerate(done_rows(batches)):
        reward = torch.cat([b["next", "reward"][env, :, 0] for b in batches]).double()
        is_init = torch.cat([b["is_init"][env, :, 0] for b in batches])
        ends = done.nonzero()[:, 0]
        assert len(ends) >= 5, "random Breakout play ends a game within 5000 steps"
        assert bool(is_init[ends[ends + 1 < len(is_init)] + 1].all()), "each lost life starts an agent episode"
        start = 0
        for game_over in ends[4::5].tolist():  # Breakout has 5 lives: 5 dones per game
            games.append((game_over + 1 - start, float(reward[start : game_over + 1].sum())))
            start = game_over + 1
    assert sorted((info["Length"], info["Return"]) for info in infos) == sorted(games)
    assert all(info["GameScore"] == info["Return"] for info in infos)


def done_rows(batches):
    """Per env, the done flags of all batches so far (``[]`` before the first)."""
    if not batches:
        return [torch.zeros(0, dtype=torch.bool)]
    return [torch.cat([b["next", "done"][env, :, 0] for b in batches]) for env in range(2)]
