"""Serial collector: layout, keys, dtypes, reset modes, decorrelation, TrajInfo, recurrent state, TorchRL losses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from collect_helpers import StairsFactory, counter_policy, mlp_policy, stairs_return
from tensordict.nn import TensorDictModule
from torchrl.envs.utils import ExplorationType

from tdrl.collect import SerialCollector, make_collector, traj_info_stats
from tdrl.envs import EnvFactory

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
    assert not torch.equal(batch["observation"][:, 1:][done[:, :-1]], batch["next", "observation"][:, :-1][done[:, :-1]])
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
    stats = traj_info_stats(first + second)
    assert stats["ReturnAverage"] == pytest.approx(ret)
    assert stats["LengthMax"] == 5 and stats["ReturnStd"] == 0.0


def test_traj_info_stats_helper():
    infos = [{"Return": 1.0, "Length": 2, "_private": 5}, {"Return": 3.0, "Length": 4, "_private": 1},
             {"Return": 8.0, "Length": 9, "_private": 0}]
    stats = traj_info_stats(infos, prefix="eval/")
    assert stats["eval/ReturnAverage"] == pytest.approx(4.0)
    assert stats["eval/ReturnMedian"] == 3.0
    assert stats["eval/ReturnStd"] == pytest.approx(np.std([1.0, 3.0, 8.0]))
    assert stats["eval/LengthMin"] == 2 and stats["eval/LengthMax"] == 9
    assert not any("_private" in k for k in stats)
    assert traj_info_stats([]) == {}


def test_truncated_is_not_terminated():
    with SerialCollector(StairsFactory(length=4, truncate=True), None, batch_B=1, batch_T=8) as c:
        batch = c.collect()
    assert batch["next", "truncated"][0, :, 0].tolist() == [False, False, False, True] * 2
    assert not batch["next", "terminated"].any()
    assert torch.equal(batch["next", "done"], batch["next", "truncated"])


def test_hot_loop_steps_below_gymnasium_make_wrappers_with_the_same_results():
    """After their first steps, envs are stepped below TimeLimit/OrderEnforcing/PassiveEnvChecker with the time
    limit applied by the loop: the batches equal stepping the wrapped envs, through many time-limit truncations."""
    import gymnasium as gym

    from tdrl.collect.stepping import env_seed

    factory = EnvFactory("CartPole-v1", {"max_episode_steps": 7})
    with SerialCollector(factory, None, batch_B=3, batch_T=30, seed=4) as c:
        batches = [c.collect().clone() for _ in range(2)]
        steppers = c.runner.envs._steppers
        assert all(limit is not None and step.__self__ is env.unwrapped
                   for (step, limit), env in zip(steppers, c.runner.envs.envs, strict=True))
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


def test_custom_outer_wrappers_are_stepped_as_they_are():
    import gymnasium as gym

    from tdrl.collect.stepping import direct_step

    env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
    env.reset(seed=0)
    env.step(0)
    env.step(0)
    assert direct_step(env) is None
    plain = EnvFactory("CartPole-v1")()
    assert direct_step(plain) is None  # not stepped yet: the env checker has its first steps to check
    plain.reset(seed=0)
    plain.step(0)
    plain.step(0)
    step, limit = direct_step(plain)
    assert step.__self__ is plain.unwrapped and limit is plain


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
        assert c.policy_step.compiled
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


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_fast_path_equals_general_path(env_id):
    """The compiled policy (direct Categorical / IndependentNormal sampling) gives the policy's own outputs."""
    from tensordict.nn import AddStateIndependentNormalScale
    from torch.distributions import Categorical
    from torchrl.modules import IndependentNormal, ProbabilisticActor, ValueOperator

    torch.manual_seed(0)
    if env_id == "CartPole-v1":
        net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        actor = ProbabilisticActor(TensorDictModule(net, ["observation"], ["logits"]), in_keys=["logits"],
                                   distribution_class=Categorical, return_log_prob=True)
        value = ValueOperator(torch.nn.Linear(4, 1), in_keys=["observation"])
    else:
        net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1),
                                  AddStateIndependentNormalScale(1))
        actor = ProbabilisticActor(TensorDictModule(net, ["observation"], ["loc", "scale"]), in_keys=["loc", "scale"],
                                   distribution_class=IndependentNormal, return_log_prob=True)
        value = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
    from tensordict.nn import TensorDictSequential

    policy = TensorDictSequential(actor, value)
    out = {}
    for fast in (True, False):
        torch.manual_seed(7)
        with SerialCollector(EnvFactory(env_id), policy, batch_B=3, batch_T=20, seed=2, fast_policy=fast) as c:
            assert c.policy_step.compiled is fast
            out[fast] = c.collect()
    assert set(out[True].keys(True, True)) == set(out[False].keys(True, True))
    assert (out[True] == out[False]).all()


@pytest.mark.parametrize("n_actions", [2, 6, 18])
def test_categorical_draw_is_torch_distributions_draw(n_actions):
    """The direct Categorical draw gives torch.distributions' actions and log-probs under the same seed (also with
    an extra batch dim and a masked -inf action), and refuses NaN logits as torch.multinomial does."""
    from torch.distributions import Categorical

    from tdrl.collect.policy import _sample_categorical

    for seed in range(20):
        torch.manual_seed(seed)
        logits = torch.randn(5, 3, n_actions) * 3
        logits[0, 0, 0] = -float("inf")
        torch.manual_seed(100 + seed)
        dist = Categorical(logits=logits)
        expected = dist.sample()
        after_torch = torch.rand(3)  # the generator state after torch's draw
        torch.manual_seed(100 + seed)
        action, log_prob = _sample_categorical(logits)
        assert torch.equal(action, expected) and torch.equal(log_prob, dist.log_prob(expected))
        assert torch.equal(torch.rand(3), after_torch)  # the same random numbers consumed
    with pytest.raises(ValueError, match="NaN"):
        _sample_categorical(torch.tensor([[0.0, float("nan")]]))


def test_fast_path_samples_sac_tanh_normal_like_torchrl():
    """SAC's TanhNormal actor (action box [-2, 2]) is sampled directly, with the actions TorchRL would draw."""
    from tdrl.collect.policy import _probabilistic_plan
    from tdrl.models.q import make_tanh_gaussian_actor

    torch.manual_seed(0)
    actor = make_tanh_gaussian_actor(EnvFactory("Pendulum-v1").specs(), hidden_sizes=[16])
    assert _probabilistic_plan(actor.module[-1], torch.Size([3])) is not None  # not the generic fallback
    out = {}
    for fast in (True, False):
        torch.manual_seed(7)
        with SerialCollector(EnvFactory("Pendulum-v1"), actor, batch_B=3, batch_T=20, seed=2, fast_policy=fast) as c:
            assert c.policy_step.compiled is fast
            out[fast] = c.collect()
    assert (out[True] == out[False]).all()
    assert out[True]["action"].abs().max() <= 2.0 and out[True]["action"].std() > 0.1


@pytest.mark.parametrize("family", ["dqn", "td3"])
def test_fast_path_runs_q_learning_action_heads_like_their_modules(family):
    """QValueModule + EpsilonGreedy (vector epsilon mid-anneal) and AdditiveGaussianModule run as direct tensor steps,
    with the actions, values and random draws of the modules themselves, in training and evaluation modes."""
    from tensordict.nn import TensorDictSequential

    from tdrl.collect.policy import _action_head_plan
    from tdrl.models.exploration import EpsilonGreedy, make_gaussian_noise
    from tdrl.models.q import make_deterministic_actor, make_q_actor

    torch.manual_seed(0)
    env_id = "CartPole-v1" if family == "dqn" else "Pendulum-v1"
    specs = EnvFactory(env_id).specs()
    if family == "dqn":
        q_actor = make_q_actor(specs, hidden_sizes=[16])
        head = EpsilonGreedy(specs.n_actions, eps_init=1.0, eps_final=0.1, eps_final_min=0.01, n_envs=4,
                             end_frames=100)
        head.set_frames(50)
        policy = TensorDictSequential(q_actor, head)
        heads = [q_actor[-1], head]
    else:
        head = make_gaussian_noise(specs, std=0.3)
        policy = TensorDictSequential(make_deterministic_actor(specs, hidden_sizes=[16]), head)
        heads = [head]
    assert all(_action_head_plan(h) is not None for h in heads)  # not the generic TensorDict fallback
    batches = {}
    for mode in (ExplorationType.RANDOM, ExplorationType.DETERMINISTIC):
        out = batches[mode] = {}
        for fast in (True, False):
            torch.manual_seed(7)
            with SerialCollector(EnvFactory(env_id), policy, batch_B=4, batch_T=30, seed=2, fast_policy=fast,
                                 exploration_type=mode) as c:
                assert c.policy_step.compiled is fast
                out[fast] = c.collect()
        assert set(out[True].keys(True, True)) == set(out[False].keys(True, True))
        assert (out[True] == out[False]).all()
    if family == "dqn":  # some training actions explored, some greedy
        train = batches[ExplorationType.RANDOM][True]
        greedy = train["action"] == train["action_value"].argmax(-1)
        assert greedy.any() and not greedy.all()


def test_sequential_mlps_run_as_direct_calls_with_current_weights():
    """nn.Sequential / TorchRL MLP chains skip Module.__call__, follow in-place weight updates, and a hooked
    module is left to its own call."""
    from torchrl.modules import MLP

    from tdrl.collect.policy import _Build, _direct_call

    torch.manual_seed(0)
    x = torch.randn(5, 4)
    nested = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(8, 3)))
    for module in (nested, MLP(in_features=4, out_features=2, num_cells=[8, 8], activation_class=torch.nn.Tanh)):
        direct = _direct_call(module, _Build(trace=True))
        assert direct is not module
        assert torch.equal(direct(x), module(x))
        with torch.no_grad():
            next(module.parameters()).add_(1.0)  # as a weight sync does
        assert torch.equal(direct(x), module(x))
    seen = []
    nested[0].register_forward_hook(lambda *args: seen.append(1))
    assert torch.equal(_direct_call(nested, _Build(trace=True))(x), nested(x)) and len(seen) == 2  # the hooked layer ran as a module


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
        assert c.state_dict() == {"frames": 30, "iter": 3}
        c.load_state_dict({"frames": 10, "iter": 1})
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
        assert c.policy_step.compiled
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


def test_gaussian_noise_step_draws_and_clips_like_the_module():
    """The collectors' step for AdditiveGaussianModule gives the module's own values from the same draws, inside and
    outside the action box (clipped), for any batch size, and refuses a negative std as torch.normal does."""
    from tdrl.collect.policy import _add_gaussian_noise
    from tdrl.models.exploration import make_gaussian_noise

    head = make_gaussian_noise(EnvFactory("Pendulum-v1").specs(), std=0.5)
    for n in (1, 3, 16, 33):
        action = torch.linspace(-3.0, 3.0, n + 2)[1:-1].reshape(n, 1)  # for n >= 16 some beyond the [-2, 2] box
        torch.manual_seed(n)
        expected = head._add_noise(action)
        torch.manual_seed(n)
        got = _add_gaussian_noise(head, action)
        assert torch.equal(got, expected) and got.abs().max() <= 2.0
        assert not torch.equal(got, head._add_noise(action))  # fresh draws differ: the comparison is not vacuous
    head.std.fill_(-1.0)
    with pytest.raises(RuntimeError, match="std >= 0"):
        head._add_noise(torch.zeros(2, 1))
    with pytest.raises(RuntimeError, match="std >= 0"):
        _add_gaussian_noise(head, torch.zeros(2, 1))
