"""Epsilon-greedy (linear annealing, vector epsilon, eval epsilon) and Gaussian action noise."""


import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential
from torchrl.envs.utils import ExplorationType, set_exploration_type

from tdrl.envs.make import EnvFactory
from tdrl.models.exploration import (
    EpsilonGreedy,
    linear_epsilon,
    make_gaussian_noise,
    vector_epsilon,
)
from tdrl.models.q import make_q_actor


def test_linear_epsilon_holds_then_ramps_then_holds():
    at = lambda f: float(linear_epsilon(f, 1.0, 0.1, start_frames=1000, end_frames=2000))  # noqa: E731
    assert at(0) == 1.0 and at(1000) == 1.0
    assert at(1500) == pytest.approx(0.55)
    assert at(2000) == pytest.approx(0.1) and at(10**9) == pytest.approx(0.1)


def test_vector_epsilon_log_spaced():
    eps = vector_epsilon(5, eps_final=0.1, eps_final_min=0.001)
    assert eps[0] == pytest.approx(0.001) and eps[-1] == pytest.approx(0.1)
    ratios = eps[1:] / eps[:-1]
    assert torch.allclose(ratios, torch.full_like(ratios, 10 ** 0.5))
    assert torch.equal(vector_epsilon(3, 0.05, None), torch.full((3,), 0.05))
    with pytest.raises(ValueError, match="eps_final_min"):
        vector_epsilon(3, 0.01, 0.1)


def test_per_env_annealing_reaches_each_final():
    greedy = EpsilonGreedy(4, eps_init=1.0, eps_final=0.1, eps_final_min=0.01, n_envs=3, start_frames=100,
                           end_frames=300)
    greedy.set_frames(50)
    assert torch.equal(greedy.eps, torch.ones(3))
    greedy.set_frames(200)
    finals = vector_epsilon(3, 0.1, 0.01)
    assert torch.allclose(greedy.eps, (1.0 + finals) / 2)
    greedy.set_frames(300)
    assert torch.allclose(greedy.eps, finals)
    # epsilon is a buffer: it travels with state_dict (weight sync to collector copies, checkpoints)
    copy = EpsilonGreedy(4, eps_final=0.1, eps_final_min=0.01, n_envs=3)
    copy.load_state_dict(greedy.state_dict())
    assert torch.equal(copy.eps, greedy.eps)


def _greedy_batch(n):
    return TensorDict(action=torch.zeros(n, dtype=torch.int64), batch_size=[n])


def test_epsilon_greedy_rates_per_env():
    torch.manual_seed(0)
    greedy = EpsilonGreedy(2, eps_init=1.0, eps_final=1.0, eps_final_min=1e-9, n_envs=2, end_frames=0)
    greedy.set_frames(0)
    assert greedy.eps[0] < 1e-8 and greedy.eps[1] == pytest.approx(1.0)
    changed = torch.zeros(2)
    for _ in range(2000):
        changed += greedy(_greedy_batch(2))["action"].float()
    assert changed[0] == 0  # env 0: epsilon ~0, always greedy
    assert 900 < changed[1] < 1100  # env 1: always random; uniform over 2 actions -> half differ from greedy


def test_epsilon_greedy_eval_mode_uses_eps_eval():
    greedy = EpsilonGreedy(10, eps_init=1.0, eps_final=1.0, eps_eval=0.0)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        assert torch.equal(greedy(_greedy_batch(500))["action"], torch.zeros(500, dtype=torch.int64))
    assert (greedy(_greedy_batch(500))["action"] != 0).any()


def test_epsilon_greedy_after_q_actor():
    specs = EnvFactory("CartPole-v1").specs()
    actor = make_q_actor(specs, hidden_sizes=(8,))
    policy = TensorDictSequential(actor, EpsilonGreedy(2, eps_init=0.0, eps_final=0.0, eps_eval=0.0))
    td = policy(TensorDict(observation=torch.randn(6, 4), batch_size=[6]))
    assert torch.equal(td["action"], td["action_value"].argmax(-1))


def test_env_index_selects_a_workers_epsilons():
    greedy = EpsilonGreedy(2, eps_final=1.0, eps_final_min=1e-9, n_envs=4, end_frames=0)
    greedy.set_frames(0)
    assert ("collector", "env_index") in greedy.in_keys
    torch.manual_seed(0)
    batch = _greedy_batch(2)  # a worker's slice: envs 2 and 3
    batch.set(("collector", "env_index"), torch.tensor([2, 3]))
    changed = sum(greedy(batch.clone())["action"].float() for _ in range(400))
    assert changed[0] < changed[1]  # env 2's epsilon is 1e-3, env 3's is 1
    with pytest.raises(ValueError, match="env_index"):
        greedy(_greedy_batch(2))


def test_group_actions_explore_per_agent_within_their_action_mask():
    """A multi-agent group's ``(group, "action")`` ``[n, n_agents]``: each agent explores on its own, and random
    actions stay inside ``(group, "action_mask")``; ``act`` (the collectors' path) draws the same actions."""
    greedy = EpsilonGreedy(4, eps_init=1.0, eps_final=1.0, action_key=("agents", "action"),
                           action_mask_key=("agents", "action_mask"))
    assert greedy.in_keys == [("agents", "action"), ("agents", "action_mask")]
    mask = torch.tensor([[True, True, True, True], [False, True, False, True], [False, False, True, False]])
    batch = TensorDict(agents=TensorDict(action=torch.zeros(2000, 3, dtype=torch.int64),
                                         action_mask=mask.expand(2000, 3, 4), batch_size=[2000, 3]), batch_size=[2000])
    torch.manual_seed(0)
    action = greedy(batch.clone())["agents", "action"]
    assert torch.equal(torch.unique(action[:, 0]), torch.arange(4))  # every action, uniformly
    assert (action[:, 0] == 3).float().mean() == pytest.approx(0.25, abs=0.04)
    assert set(action[:, 1].tolist()) == {1, 3} and set(action[:, 2].tolist()) == {2}
    torch.manual_seed(0)
    acted = greedy.act(torch.zeros(0), {("agents", "action"): batch["agents", "action"],
                                        ("agents", "action_mask"): batch["agents", "action_mask"]}, deterministic=False)
    assert torch.equal(acted[("agents", "action")], action)


def test_vector_epsilon_batch_mismatch_is_an_error():
    greedy = EpsilonGreedy(2, eps_final=0.1, eps_final_min=0.01, n_envs=4)
    with pytest.raises(ValueError, match="n_envs"):
        greedy(_greedy_batch(3))


def test_bad_epsilon_values():
    with pytest.raises(ValueError, match="eps_final"):
        EpsilonGreedy(2, eps_final=1.5)


def test_gaussian_noise_scaled_clipped_and_off_in_eval():
    torch.manual_seed(0)
    specs = EnvFactory("Pendulum-v1").specs()  # action box [-2, 2]
    noise = make_gaussian_noise(specs, std=0.1)
    td = noise(TensorDict(action=torch.zeros(20000, 1), batch_size=[20000]))
    assert td["action"].std().item() == pytest.approx(0.2, rel=0.05)  # 0.1 x half-width 2
    edge = noise(TensorDict(action=torch.full((1000, 1), 2.0), batch_size=[1000]))["action"]
    assert edge.max() <= 2.0 and edge.min() < 2.0
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        assert torch.equal(noise(TensorDict(action=torch.ones(5, 1), batch_size=[5]))["action"], torch.ones(5, 1))
    torch.testing.assert_close(noise.std, torch.tensor([0.2]))


def test_gaussian_noise_is_wide_until_learning_starts():
    """rlpyt's pretrain_std: the std is ``pretrain_std`` until ``start_frames``, then ``std``; the std in use is a
    buffer, so a checkpoint (and a weight sync to collector copies) carries it."""
    specs = EnvFactory("Pendulum-v1").specs()  # action box [-2, 2]
    noise = make_gaussian_noise(specs, std=0.1, pretrain_std=0.5, start_frames=1000)
    torch.testing.assert_close(noise.std, torch.tensor([1.0]))  # 0.5 x half-width 2
    noise.set_frames(999)
    torch.testing.assert_close(noise.std, torch.tensor([1.0]))
    noise.set_frames(1000)
    torch.testing.assert_close(noise.std, torch.tensor([0.2]))
    restored = make_gaussian_noise(specs, std=0.1, pretrain_std=0.5, start_frames=1000)
    restored.load_state_dict(noise.state_dict())
    torch.testing.assert_close(restored.std, torch.tensor([0.2]))
    without = make_gaussian_noise(specs, std=0.1, start_frames=1000)  # no pretrain_std: one std throughout
    without.set_frames(0)
    torch.testing.assert_close(without.std, torch.tensor([0.2]))
