"""Serial collector: layout, keys, dtypes, reset modes, decorrelation, TrajInfo, recurrent state, TorchRL losses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from collect_helpers import StairsFactory, counter_policy, mlp_policy, stairs_return
from tensordict.nn import TensorDictModule
from torchrl.envs.utils import ExplorationType

from tdrl.collect import SerialCollector, make_collector
from tdrl.envs import EnvFactory
from tdrl.utils.stats import summarize_records

pytestmark = pytest.mark.timeout(120)


def test_layout_keys_dtypes_cartpole():
    policy = mlp_policy(4, 2, discrete=True)
    with make_collector("serial", EnvFactory("CartPole-v1"), policy, batch_B=4, batch_T=16, seed=1) as c:
        batch = c.collect()
    assert batch.batch_size == torch.Size([4, 16])
    expect = {
        "observation": ((4, 16, 4), torch.float32),
        "is_init": ((4, 16, 1), torch.bool),
        "action": ((4, 16), torch.int64),
        ("next", "observation"): ((4, 16, 4), torch.float32),
        ("next", "reward"): ((4, 16, 1), torch.float32),
        ("next", "done"): ((4, 16, 1), torch.bool),
        ("next", "terminated"): ((4, 16, 1), torch.bool),
        ("next", "truncated"): ((4, 16, 1), torch.bool),
        ("collector", "mask"): ((4, 16), torch.bool),
        ("collector", "traj_ids"): ((4, 16), torch.int64),
    }
    for key, (shape, dtype) in expect.items():
        assert batch.get(key).shape == shape, key
        assert batch.get(key).dtype == dtype, key
    # The batch is a copy: collecting again does not change it.
    assert batch["next", "reward"].eq(1).all()


def test_time_is_last_and_transitions_chain():
    """observation[t+1] == next/observation[t] unless the env was reset at t (CartPole dynamics replayed)."""
    with SerialCollector(EnvFactory("CartPole-v1"), None, batch_B=3, batch_T=64, seed=3) as c:
        batch = c.collect()
        second = c.collect()
    done = batch["next", "done"][..., 0]
    same = batch["observation"][:, 1:] == batch["next", "observation"][:, :-1]
    assert same.all(-1)[~done[:, :-1]].all()
    assert batch["is_init"][:, 1:, 0][done[:, :-1]].all()
    ends = done[:, :-1]
    assert not torch.equal(batch["observation"][:, 1:][ends], batch["next", "observation"][:, :-1][ends])
    # Batches chain too: the first observation of a batch is the last next-observation (or a reset).
    cont = ~done[:, -1]
    assert torch.equal(second["observation"][cont, 0], batch["next", "observation"][cont, -1])
    # Replay CartPole: stepping a fresh env from the stored state gives the stored next state.
    import gymnasium as gym

    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    for b in range(3):
        for t in range(63):
            if done[b, t]:
                continue
            env.state = batch["observation"][b, t].double().numpy()
            obs, *_ = env.step(int(batch["action"][b, t]))
            np.testing.assert_allclose(obs, batch["next", "observation"][b, t].numpy(), rtol=1e-5, atol=1e-6)


def test_traj_infos_match_hand_computed_episodes():
    discount = 0.9
    ret, disc, nonzero = stairs_return(5, discount)
    with SerialCollector(StairsFactory(length=5), None, batch_B=2, batch_T=12, discount=discount, seed=0) as c:
        c.collect()
        first = c.traj_infos
        c.collect()
        second = c.traj_infos
    # Episodes end at env steps 5, 10 (batch 1: steps 1-12) and 15, 20 (batch 2: steps 13-24); the third
    # episode spans the batch boundary and its sums carry over.
    assert len(first) == 4 and len(second) == 4
    for info in first + second:
        assert info == pytest.approx({"Length": 5, "Return": ret, "NonzeroRewards": nonzero, "DiscountedReturn": disc})
    stats = summarize_records(first + second)
    assert stats["train/return_mean"] == pytest.approx(ret)
    assert stats["train/length_max"] == 5 and stats["train/return_std"] == 0.0


def test_truncated_is_not_terminated():
    with SerialCollector(StairsFactory(length=4, truncate=True), None, batch_B=1, batch_T=8) as c:
        batch = c.collect()
    assert batch["next", "truncated"][0, :, 0].tolist() == [False, False, False, True] * 2
    assert not batch["next", "terminated"].any()
    assert torch.equal(batch["next", "done"], batch["next", "truncated"])


def test_batches_equal_stepping_gymnasium_envs_through_time_limits():
    """The batches equal stepping ``gymnasium.make`` envs seeded as the collector seeds them, through many time-limit
    truncations."""
    import gymnasium as gym

    from tdrl.collect.stepping import env_seed

    factory = EnvFactory("CartPole-v1", {"max_episode_steps": 7})
    with SerialCollector(factory, None, batch_B=3, batch_T=30, seed=4) as c:
        batches = [c.collect().clone() for _ in range(2)]
    actions = torch.cat([b["action"] for b in batches], 1)
    expected = {k: torch.cat([b["next", k] for b in batches], 1) for k in ("observation", "reward", "terminated",
                                                                          "truncated")}
    assert expected["truncated"].sum() >= 6 and not expected["terminated"].all()
    for i in range(3):
        env = gym.make("CartPole-v1", max_episode_steps=7)
        env.reset(seed=env_seed(4, i))
        for t in range(60):
            obs, reward, term, trunc, _ = env.step(int(actions[i, t]))
            assert np.array_equal(obs, expected["observation"][i, t].numpy())
            assert (reward, term, trunc) == (expected["reward"][i, t, 0].item(),
                                             expected["terminated"][i, t, 0].item(),
                                             expected["truncated"][i, t, 0].item()), (i, t)
            if term or trunc:
                env.reset()


class _ConstantBoxAction(torch.nn.Module):
    def __init__(self, value: float, size: int) -> None:
        super().__init__()
        self.value, self.size = value, size

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.full((*obs.shape[:-1], self.size), self.value)


def test_actions_beyond_the_bounds_reach_the_env_clipped_and_stay_in_the_batch():
    """HalfCheetah's control cost is computed on the action as given (MuJoCo clamps only the torque): 3.0 must act
    and cost as its bound 1.0, as SB3 sends it, while the batch keeps 3.0 for the policy's log-probability."""
    batches = []
    for value in (3.0, 1.0):
        policy = TensorDictModule(_ConstantBoxAction(value, 6), in_keys=["observation"], out_keys=["action"])
        collector = make_collector("serial", EnvFactory("HalfCheetah-v5"), policy, batch_B=2, batch_T=8, seed=1)
        batches.append(next(iter(collector)))
        collector.shutdown()
    beyond, bound = batches
    assert (beyond["action"] == 3.0).all()
    torch.testing.assert_close(beyond["next", "reward"], bound["next", "reward"])
    torch.testing.assert_close(beyond["next", "observation"], bound["next", "observation"])


def test_reset_at_once_stores_final_observation():
    with SerialCollector(StairsFactory(length=3), None, batch_B=1, batch_T=6) as c:
        batch = c.collect()
    assert batch["next", "observation"][0, :, 0].tolist() == [1, 2, 3, 1, 2, 3]
    assert batch["observation"][0, :, 0].tolist() == [0, 1, 2, 0, 1, 2]
    assert batch["is_init"][0, :, 0].tolist() == [True, False, False, True, False, False]
    assert batch["collector", "traj_ids"][0].tolist() == [0, 0, 0, 1, 1, 1]


def test_wait_reset_idles_finished_envs_until_batch_end():
    """Both envs finish at t=2 and idle (zeros, mask False) until the batch ends, then start fresh."""
    discount = 0.99
    factory = StairsFactory(length=3)
    with SerialCollector(factory, None, batch_B=2, batch_T=5, reset_mode="wait_reset", discount=discount) as c:
        batch = c.collect()
        infos = c.traj_infos
        batch2 = c.collect()
    mask = batch["collector", "mask"]
    assert mask[0].tolist() == [True, True, True, False, False]
    assert mask[1].tolist() == [True, True, True, False, False]
    assert batch["next", "reward"][~mask].eq(0).all() and batch["observation"][~mask].eq(0).all()
    assert not batch["next", "done"][~mask].any()
    assert batch["collector", "traj_ids"][~mask].eq(-1).all()
    assert len(infos) == 2
    # Next batch starts with fresh episodes for both envs.
    assert batch2["observation"][:, 0, 0].tolist() == [0, 0] and batch2["is_init"][:, 0, 0].all()
    assert batch2["collector", "mask"][:, :3].all()


def test_wait_reset_mixed_lengths():
    with SerialCollector(StairsFactory(length=4), None, batch_B=1, batch_T=10, reset_mode="wait_reset") as c:
        batch = c.collect()
    assert batch["collector", "mask"][0].tolist() == [True] * 4 + [False] * 6
    assert batch["next", "done"][0, :, 0].tolist() == [False, False, False, True] + [False] * 6


def test_decorrelation_steps_are_random_per_env_and_not_recorded():
    factory = StairsFactory(length=50)
    with SerialCollector(factory, None, batch_B=8, batch_T=4, max_decorrelation_steps=30, seed=5) as c:
        batch = c.collect()
    start_k = batch["observation"][:, 0, 0]
    assert (start_k >= 0).all() and (start_k <= 30).all()
    assert len(set(start_k.tolist())) > 3  # envs start at different points of their episodes
    # Every env starts with zero recurrent state, hence is_init on the first step.
    assert batch["is_init"][:, 0].all()
    with SerialCollector(factory, None, batch_B=8, batch_T=4, max_decorrelation_steps=30, seed=5) as c:
        assert torch.equal(c.collect()["observation"], batch["observation"])
    with SerialCollector(factory, None, batch_B=8, batch_T=4, max_decorrelation_steps=0, seed=5) as c:
        assert c.collect()["observation"][:, 0, 0].eq(0).all()


def test_decorrelation_counts_toward_first_episode_return():
    factory = StairsFactory(length=10)
    with SerialCollector(factory, None, batch_B=6, batch_T=30, max_decorrelation_steps=25, seed=2) as c:
        c.collect()
        infos = c.traj_infos
    ret, _, _ = stairs_return(10, 0.99)
    assert infos and all(info["Length"] == 10 and info["Return"] == pytest.approx(ret) for info in infos)


def test_recurrent_state_kept_per_env_and_reset_on_done():
    with SerialCollector(StairsFactory(length=4), counter_policy(), batch_B=2, batch_T=11,
                         max_decorrelation_steps=3, seed=1) as c:
        batch = c.collect()
        batch2 = c.collect()
    for b in (batch, batch2):
        h = b["recurrent_state", "h"][..., 0]
        h_next = b["next", "recurrent_state", "h"][..., 0]
        assert torch.equal(h_next, h + 1)
    # After start-up every env has zero state; then h counts steps since the last episode start.
    assert batch["recurrent_state", "h"][:, 0].eq(0).all()
    k = batch["observation"][..., 0]
    after_first_reset = torch.cumsum(batch["is_init"][..., 0].long(), 1) > 1
    assert torch.equal(batch["recurrent_state", "h"][..., 0][after_first_reset], k[after_first_reset])
    # State carries across batches (no reset at the boundary unless an episode ended).
    k2 = batch2["observation"][..., 0]
    assert torch.equal(batch2["recurrent_state", "h"][..., 0], k2)


def test_policy_outputs_are_stored_and_exploration_type_respected():
    from torch.distributions import Categorical
    from torchrl.modules import ProbabilisticActor, ValueOperator

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    actor = ProbabilisticActor(TensorDictModule(net, ["observation"], ["logits"]), in_keys=["logits"],
                               distribution_class=Categorical, return_log_prob=True)
    value = ValueOperator(torch.nn.Linear(4, 1), in_keys=["observation"])
    from tensordict.nn import TensorDictSequential

    policy = TensorDictSequential(actor, value)
    with SerialCollector(EnvFactory("CartPole-v1"), policy, batch_B=4, batch_T=32, seed=0) as c:
        assert c.engine.policy_step.acting  # a user's TensorDictSequential: on tensors (tdrl.collect.module_act)
        batch = c.collect()
    for key in ("logits", "action_log_prob", "state_value"):
        assert key in batch.keys(True, True), key
    assert batch["state_value"].shape == (4, 32, 1)
    logp = torch.log_softmax(batch["logits"], -1).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp, batch["action_log_prob"])
    assert not torch.equal(batch["action"], batch["logits"].argmax(-1))  # sampled, not greedy
    with SerialCollector(EnvFactory("CartPole-v1"), policy, batch_B=4, batch_T=32, seed=0,
                         exploration_type=ExplorationType.DETERMINISTIC) as greedy_c:
        greedy = greedy_c.collect()
    assert torch.equal(greedy["action"], greedy["logits"].argmax(-1))
    # Without an explicit type the collector follows the caller's set_exploration_type context.
    from torchrl.envs.utils import set_exploration_type

    with SerialCollector(EnvFactory("CartPole-v1"), policy, batch_B=4, batch_T=32, seed=0) as c:
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            in_context = c.collect()
        outside = c.collect()
    assert torch.equal(in_context["action"], in_context["logits"].argmax(-1))
    assert not torch.equal(outside["action"], outside["logits"].argmax(-1))


def _tdrl_policies():
    from tensordict.nn import TensorDictSequential

    from tdrl.models import EpsilonGreedy, make_actor_critic, make_gaussian_noise
    from tdrl.models.q import make_deterministic_actor, make_q_actor, make_tanh_gaussian_actor

    cartpole, pendulum = EnvFactory("CartPole-v1").specs(), EnvFactory("Pendulum-v1").specs()
    eps = EpsilonGreedy(2, eps_init=1.0, eps_final=0.1, eps_final_min=0.01, n_envs=4, end_frames=100)
    eps.set_frames(50)
    return {
        "ppo_categorical": ("CartPole-v1", make_actor_critic(cartpole).actor),
        "ppo_normal": ("Pendulum-v1", make_actor_critic(pendulum, distribution="normal").actor),
        "ppo_tanh_normal": ("Pendulum-v1", make_actor_critic(pendulum).actor),
        "sac": ("Pendulum-v1", make_tanh_gaussian_actor(pendulum, hidden_sizes=[16])),
        "td3": ("Pendulum-v1", TensorDictSequential(make_deterministic_actor(pendulum, hidden_sizes=[16]),
                                                make_gaussian_noise(pendulum, std=0.3))),
        "dqn": ("CartPole-v1", TensorDictSequential(make_q_actor(cartpole, hidden_sizes=[16]), eps)),
    }


@pytest.mark.parametrize("name", ["ppo_categorical", "ppo_normal", "ppo_tanh_normal", "sac", "td3", "dqn"])
def test_acting_policies_give_the_batches_of_their_tensordict_forward(name):
    """tdrl's models are called through act(); the batches equal those of the same model run on TensorDicts, in
    training (same random draws) and evaluation modes."""
    from tensordict.nn import TensorDictSequential

    class PlainSequential(TensorDictSequential):  # a forward of its own: the collector runs it on TensorDicts
        def forward(self, tensordict, **kwargs):
            return super().forward(tensordict, **kwargs)

    torch.manual_seed(0)
    env_id, policy = _tdrl_policies()[name]
    for mode in (ExplorationType.RANDOM, ExplorationType.DETERMINISTIC):
        out = {}
        for acting in (True, False):
            torch.manual_seed(7)
            p = policy if acting else PlainSequential(policy)
            with SerialCollector(EnvFactory(env_id), p, batch_B=4, batch_T=30, seed=2, exploration_type=mode) as c:
                assert c.engine.policy_step.acting is acting
                out[acting] = c.collect()
        assert set(out[True].keys(True, True)) == set(out[False].keys(True, True))
        assert (out[True] == out[False]).all(), (name, mode)
    if name == "dqn":  # some training actions explored, some greedy
        assert 0 < (out[True]["action"] == out[True]["action_value"].argmax(-1)).float().mean() <= 1


def test_act_writing_other_keys_than_forward_is_refused():
    from tdrl.models.q import make_deterministic_actor

    class Liar(type(make_deterministic_actor(EnvFactory("Pendulum-v1").specs(), hidden_sizes=[8]))):
        def act(self, observation, inputs, *, deterministic):
            return {"action": self.module(observation), "extra": observation}

    liar = make_deterministic_actor(EnvFactory("Pendulum-v1").specs(), hidden_sizes=[8])
    liar.__class__ = Liar
    with pytest.raises(TypeError, match="act writes"):
        SerialCollector(EnvFactory("Pendulum-v1"), liar, batch_B=2, batch_T=4)


@pytest.mark.slow
def test_compiled_act_gives_the_same_batches():
    """compile=True runs the PPO actor's act through torch.compile: the same greedy actions, the same values up to
    float rounding (fused kernels)."""
    from tdrl.models import make_actor_critic

    torch.manual_seed(0)
    actor = make_actor_critic(EnvFactory("CartPole-v1").specs()).actor
    out = {}
    for compile in (False, True):
        torch.manual_seed(7)
        with SerialCollector(EnvFactory("CartPole-v1"), actor, batch_B=4, batch_T=16, seed=2,
                             exploration_type="deterministic", compile=compile) as c:
            out[compile] = c.collect()
    assert torch.equal(out[True]["action"], out[False]["action"])
    for key in ("logits", "action_log_prob"):
        torch.testing.assert_close(out[True][key], out[False][key])


def test_torchrl_gae_and_clip_ppo_run_on_a_batch():
    from torch.distributions import Categorical
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    torch.manual_seed(0)
    actor = ProbabilisticActor(
        TensorDictModule(torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)),
                         ["observation"], ["logits"]),
        in_keys=["logits"], distribution_class=Categorical, return_log_prob=True)
    critic = ValueOperator(torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)),
                           in_keys=["observation"])
    with make_collector("serial", EnvFactory("CartPole-v1"), actor, batch_B=4, batch_T=64, seed=0) as c:
        batch = c.collect()
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
    with torch.no_grad():
        gae(batch)
    assert batch["advantage"].shape == (4, 64, 1) and torch.isfinite(batch["advantage"]).all()
    loss = ClipPPOLoss(actor, critic)
    out = loss(batch.reshape(-1))
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    total.backward()
    assert all(p.grad is not None for p in actor.parameters())
    # The stored log-prob is what the loss recomputes for the unchanged policy: ratio 1 → clip fraction 0.
    assert float(out["clip_fraction"]) == 0.0


def test_total_frames_len_state_dict_and_bad_args():
    with SerialCollector(StairsFactory(), None, batch_B=2, batch_T=5, total_frames=25) as c:
        assert len(c) == 3
        assert sum(b.numel() for b in c) == 30
        state = c.state_dict()
        assert (state["frames"], state["iter"]) == (30, 3)
        c.load_state_dict({"frames": 10, "iter": 1})  # a checkpoint written before env state was captured
        assert c.frames == 10
    c.shutdown()  # idempotent
    with pytest.raises(ValueError, match="batch_B"):
        SerialCollector(StairsFactory(), None, batch_B=0, batch_T=5)
    with pytest.raises(ValueError, match="reset_mode"):
        SerialCollector(StairsFactory(), None, batch_B=1, batch_T=5, reset_mode="sometimes")
    with pytest.raises(ValueError, match="unknown collector kind 'gpu'"):
        make_collector("gpu", StairsFactory(), None, batch_B=1, batch_T=5)
    with pytest.raises(KeyError, match="pixels"):
        SerialCollector(StairsFactory(), TensorDictModule(torch.nn.Identity(), ["pixels"], ["action"]),
                        batch_B=1, batch_T=5)


def test_update_policy_weights_from_state_dict():
    from collect_helpers import ConstantAction

    policy = TensorDictModule(ConstantAction(0), ["observation"], ["action"])
    with SerialCollector(StairsFactory(), policy, batch_B=2, batch_T=4) as c:
        assert c.engine.policy_step.acting  # a user's TensorDictModule: its network on tensors
        assert c.collect()["action"].eq(0).all()
        other = TensorDictModule(ConstantAction(1), ["observation"], ["action"])
        c.update_policy_weights_(other.state_dict())
        assert c.collect()["action"].eq(1).all()


def test_torchrl_lstm_and_egreedy_dqn_policies():
    """TorchRL's LSTMModule (is_init + recurrent keys) and a QValueActor + EGreedyModule run unchanged."""
    from tensordict.nn import TensorDictSequential
    from torchrl.data import Categorical
    from torchrl.modules import MLP, EGreedyModule, LSTMModule, QValueActor

    torch.manual_seed(0)
    lstm = LSTMModule(input_size=4, hidden_size=8, in_key="observation", out_key="features")
    head = QValueActor(torch.nn.Linear(8, 2), in_keys=["features"], spec=Categorical(2))
    with SerialCollector(EnvFactory("CartPole-v1"), TensorDictSequential(lstm, head), batch_B=3, batch_T=40) as c:
        batch = c.collect()
    h, init = batch["recurrent_state_h"], batch["is_init"][..., 0]
    assert h[init].eq(0).all() and h[~init].abs().sum() > 0
    follows = ~init[:, 1:]
    assert torch.equal(batch["next", "recurrent_state_h"][:, :-1][follows], h[:, 1:][follows])
    q = QValueActor(MLP(in_features=4, out_features=2, num_cells=[16]), in_keys=["observation"], spec=Categorical(2))
    dqn = TensorDictSequential(q, EGreedyModule(Categorical(2), eps_init=0.5, eps_end=0.5))
    with SerialCollector(EnvFactory("CartPole-v1"), dqn, batch_B=4, batch_T=100) as c:
        batch = c.collect()
    greedy = (batch["action"] == batch["action_value"].argmax(-1)).float().mean()
    assert 0.6 < greedy < 0.9  # eps=0.5 over 2 actions: ~75% greedy


def test_atari_traj_infos_carry_game_score():
    from collect_helpers import AtariLikeFactory

    with SerialCollector(AtariLikeFactory(length=4), None, batch_B=1, batch_T=8) as c:
        c.collect()
        infos = c.traj_infos
    ret = stairs_return(4, 0.99)[0]
    assert len(infos) == 2 and all(i["GameScore"] == i["Return"] == pytest.approx(ret) for i in infos)
