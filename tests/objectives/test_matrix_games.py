"""IQL, VDN and QMIX (tdrl/objectives/value_decomposition.py) on Claus & Boutilier's matrix games
(tdrl/envs/matrix_games.py), checked against values computed by hand.

The games (Claus & Boutilier 1998, AAAI) are one step long, so a learner's Q-values are regressions of the payoff:
what each method converges to is a least-squares fit we can compute, and its greedy joint action is the test.

- With full exploration (every joint action equally often: ``every_joint_action``), IQL's Q_i is the payoff averaged
  over the partner's uniform action, and VDN's Q_1 + Q_2 is the additive least-squares fit (row mean + column mean -
  grand mean). Both are exact and both pick (2, 2) -> 5 on climbing and the safe (1, 1) -> 2 on penalty (k = -100),
  not the optima (0, 0) -> 11 and (0, 2) / (2, 0) -> 10: the -30 and -100 penalties weigh on the optimal actions'
  averages.
- QMIX's monotonic mix is a projection too (Rashid et al. 2020, "Weighted QMIX", NeurIPS: the unweighted squared
  error over all joint actions). Its mixes include VDN's sum, so it fits at least as well, but it cannot rank an
  agent's actions differently for different partner actions, which both games require: the best monotonic fit of
  climbing (2-D isotonic regression over the 36 action orderings, squared error 997 against VDN's 1576) still puts
  its max at (2, 2) -> 5, and of penalty at (1, 1) -> 2. The network lands in that region: (2, 2) (in 300 steps
  from seed 0, at VDN's fit) or (1, 2) -> 6 (a better fit, from other seeds or longer training).
- A learner of the joint action (one Q over the 9 pairs) finds both optima from the same data: the failures above are
  the factorizations', not the data's.
- With epsilon-greedy exploration decayed to 0.05 the agents climb, the dynamics the game is named for (Claus &
  Boutilier): from (2, 2) -> 5 to (1, 2) -> 6 to (1, 1) -> 7, where they stop; the -30 next to (0, 0) keeps them
  from 11. IQL and QMIX reach (1, 1) from seeds 0-5; VDN stops earlier, at (2, 2) or (1, 2), and is not tested here.
"""

import functools

import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.envs.utils import check_env_specs
from torchrl.modules import QValueActor
from torchrl.objectives import DQNLoss

from tdrl.collect import make_collector
from tdrl.envs.matrix_games import (
    CLIMBING,
    MatrixGame,
    MatrixGameParallel,
    climbing_game,
    every_joint_action,
    penalty_payoff,
)
from tdrl.envs.multiagent import GroupedEnv
from tdrl.objectives.value_decomposition import make_group_q, make_value_decomposition_loss

GAMES = {"climbing": CLIMBING, "penalty": penalty_payoff(-100.0)}
# The greedy joint action each factorization reaches with full exploration, and its payoff.
SUBOPTIMAL = {"climbing": ((2, 2), 5.0), "penalty": ((1, 1), 2.0)}
QMIX_CLIMBING = {(2, 2), (1, 2)}  # QMIX's better fits may rank agent 0's action 1 first: (1, 2) -> 6

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


def make_loss(method, *, share_params=True, seed=0, double_q=False):
    torch.manual_seed(seed)
    q = make_group_q(2, 2, 3, share_params=share_params)
    loss = make_value_decomposition_loss(method, q, n_agents=2, state_shape=(1,), double_q=double_q)
    loss.make_value_estimator(gamma=0.99)
    return q, loss


def joint_values(q, loss, data):
    """The learned Q_tot of every joint action in ``data``, as a [3, 3] matrix (VDN, QMIX)."""
    with torch.no_grad():
        td = q(data.clone())
        chosen = td["agents", "action_value"].gather(-1, data["agents", "action"].unsqueeze(-1))
        td.set(("agents", "chosen_action_value"), chosen)
        with loss.mixer_network_params.to_module(loss.mixer_network):
            return loss.mixer_network(td)["chosen_action_value"].view(3, 3)


@functools.cache
def fit_uniform(method, game, steps=300, lr=3e-2):
    """Train ``method`` by full-batch Adam on one transition per joint action. Returns the per-agent Q-values
    [2, 3], the greedy joint action, and Q_tot [3, 3] (None for IQL)."""
    data = every_joint_action(MatrixGame(GAMES[game]))
    q, loss = make_loss(method)
    optim = torch.optim.Adam(loss.parameters(), lr=lr)
    for _ in range(steps):
        value = loss(data.clone())["loss"]
        optim.zero_grad()
        value.backward()
        optim.step()
    with torch.no_grad():
        td = q(data[:1].clone())
    q_tot = None if method == "iql" else joint_values(q, loss, data)
    return td["agents", "action_value"][0], tuple(td["agents", "action"][0].tolist()), q_tot


def test_the_games_pay_their_matrices():
    check_env_specs(climbing_game(batch_size=(4,)))
    data = every_joint_action(MatrixGame(GAMES["penalty"]))
    assert data["agents", "action"].tolist() == [[a, b] for a in range(3) for b in range(3)]
    assert data["next", "reward"].view(3, 3).equal(GAMES["penalty"])
    assert data["next", "agents", "reward"].shape == (9, 2, 1)
    assert data["next", "agents", "reward"][:, 1].equal(data["next", "reward"])
    assert data["agents", "observation"][0].equal(torch.eye(2))  # one-hot agent ids
    assert data["next", "terminated"].all() and data["agents", "mask"].all()
    with pytest.raises(ValueError, match="<= 0"):
        penalty_payoff(5.0)


@pytest.mark.parametrize("game", GAMES)
def test_iql_learns_each_agents_value_averaged_over_its_partner(game):
    q_values, greedy, _ = fit_uniform("iql", game)
    payoff = GAMES[game]
    marginal = torch.stack([payoff.mean(1), payoff.mean(0)])  # agent 0 averages over columns, agent 1 over rows
    torch.testing.assert_close(q_values, marginal, atol=0.05, rtol=0)
    assert (greedy, payoff[greedy].item()) == SUBOPTIMAL[game]


@pytest.mark.parametrize("game", GAMES)
def test_vdn_learns_the_additive_least_squares_fit(game):
    _, greedy, q_tot = fit_uniform("vdn", game)
    payoff = GAMES[game]
    additive = payoff.mean(1, keepdim=True) + payoff.mean(0, keepdim=True) - payoff.mean()
    torch.testing.assert_close(q_tot, additive, atol=0.05, rtol=0)
    assert (greedy, payoff[greedy].item()) == SUBOPTIMAL[game]
    if game == "climbing":  # the optimum is valued -9.2 (it pays 11), the greedy pair 8.8 (it pays 5)
        assert q_tot[0, 0] == pytest.approx(-83 / 9, abs=0.05) and q_tot[2, 2] == pytest.approx(79 / 9, abs=0.05)


@pytest.mark.parametrize("game", GAMES)
def test_qmix_fits_at_least_as_well_as_vdn_and_still_misses_the_optimum(game):
    _, greedy, q_tot = fit_uniform("qmix", game)
    _, _, vdn_tot = fit_uniform("vdn", game)
    payoff = GAMES[game]
    error = lambda fit: (fit - payoff).pow(2).mean().item()  # noqa: E731
    assert error(q_tot) <= 1.001 * error(vdn_tot)  # monotonic mixes include the additive one
    # Monotonic, hence decentralisable: the agents' own greedy actions are Q_tot's best joint action.
    assert divmod(q_tot.argmax().item(), 3) == greedy
    allowed = QMIX_CLIMBING if game == "climbing" else {SUBOPTIMAL[game][0]}
    assert greedy in allowed, f"QMIX's greedy joint action {greedy} pays {payoff[greedy].item()}"


@pytest.mark.parametrize("game", GAMES)
def test_a_joint_action_learner_finds_the_optimum_in_the_same_data(game):
    torch.manual_seed(0)
    data = every_joint_action(MatrixGame(GAMES[game]))
    ones = torch.ones(9, 1)  # one state; the rows are the joint actions 3 * a_0 + a_1 in order
    joint = TensorDict(observation=ones, action=torch.arange(9), batch_size=[9],
                       next=data["next"].select("reward", "done", "terminated").set("observation", ones))
    q = QValueActor(nn.Linear(1, 9), in_keys=["observation"], action_space="categorical")
    loss = DQNLoss(q, action_space="categorical", delay_value=False)
    loss.make_value_estimator(gamma=0.99)
    optim = torch.optim.Adam(loss.parameters(), lr=0.5)
    for _ in range(300):
        value = loss(joint.clone())["loss"]
        optim.zero_grad()
        value.backward()
        optim.step()
    best = divmod(q(joint[:1].clone())["action"].item(), 3)
    assert GAMES[game][best].item() == GAMES[game].max().item()  # (0, 0) -> 11; (0, 2) or (2, 0) -> 10


def climb(method, *, iterations=900, n_envs=128, seed=0):
    """Epsilon-greedy play of the climbing game (epsilon 1 -> 0.05 over 300 iterations), one update per
    iteration on 128 of the last 512 transitions. Returns the greedy joint action."""
    q, loss = make_loss(method, seed=seed)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-2)
    env, recent = climbing_game(batch_size=(n_envs,)), None
    for i in range(iterations):
        eps = max(0.05, 1 - i / 300)
        with torch.no_grad():
            td = q(env.reset())
        explore = torch.rand(n_envs, 2) < eps
        td.set(("agents", "action"), torch.where(explore, torch.randint(0, 3, (n_envs, 2)), td["agents", "action"]))
        td = env.step(td.exclude(("agents", "action_value"), ("agents", "chosen_action_value")))
        recent = td if recent is None else torch.cat([recent, td])[-512:]
        value = loss(recent[torch.randint(0, len(recent), (128,))])["loss"]
        optim.zero_grad()
        value.backward()
        optim.step()
    with torch.no_grad():
        return tuple(q(env.reset()[:1])["agents", "action"][0].tolist())


@pytest.mark.parametrize("method", ["iql", "qmix"])
def test_epsilon_greedy_agents_climb_to_seven_and_stop(method):
    assert climb(method) == (1, 1)  # pays 7; the optimum (0, 0) pays 11


def grouped_climbing():
    return GroupedEnv(MatrixGameParallel(CLIMBING), group_map="one_group")


@pytest.mark.parametrize("method", ["iql", "vdn", "qmix"])
def test_the_losses_learn_from_batches_of_tdrls_collector(method):
    """Random actions through GroupedEnv and the serial collector: the [B, T] grouped batch, flattened, is what the
    losses read, and the greedy joint action is the full-exploration one (the root reward is twice the payoff)."""
    collector = make_collector("serial", grouped_climbing, None, batch_B=8, batch_T=64, seed=1)
    batch = next(iter(collector)).reshape(-1)
    collector.shutdown()
    assert batch["next", "reward"].equal(2 * batch["next", "agents", "reward"][:, 0])
    q, loss = make_loss(method)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-2)
    for _ in range(200):
        value = loss(batch.clone())["loss"]
        optim.zero_grad()
        value.backward()
        optim.step()
    with torch.no_grad():
        greedy = tuple(q(batch[:1].clone())["agents", "action"][0].tolist())
    assert greedy in (QMIX_CLIMBING if method == "qmix" else {SUBOPTIMAL["climbing"][0]})


def absent_agent_batch(terminal):
    """Climbing's nine transitions with agent 1 absent at t (or, when not ``terminal``, only at t+1)."""
    data = every_joint_action(climbing_game())
    if terminal:
        data["agents", "mask"][:, 1] = False
    else:
        for key in ("done", "terminated"):
            data["next", key].zero_()
    data["next", "agents", "mask"][:, 1] = False
    return data


@pytest.mark.parametrize("double_q", [False, True])
@pytest.mark.parametrize("method", ["iql", "vdn", "qmix"])
def test_an_absent_agent_gets_no_gradient_and_changes_no_loss(method, double_q):
    q, loss = make_loss(method, share_params=False, double_q=double_q)
    data = absent_agent_batch(terminal=True)
    value = loss(data.clone())["loss"]
    value.backward()
    for name, param in q.named_parameters():  # per-agent weights, stacked: [agent, ...]
        assert param.grad[1].abs().sum() == 0 and param.grad[0].abs().sum() > 0, name
    shuffled = data.clone()
    shuffled["agents", "action"][:, 1] = shuffled["agents", "action"][:, 1].flip(0)
    assert loss(shuffled)["loss"].item() == pytest.approx(value.item())
    if method != "qmix":  # VDN's Q_tot and IQL's mean are agent 0's Q alone
        chosen = q(data.clone())["agents", "action_value"][:, 0].gather(-1, data["agents", "action"][:, :1])
        assert value.item() == pytest.approx((chosen - data["next", "reward"]).pow(2).mean().item(), rel=1e-5)


@pytest.mark.parametrize("double_q", [False, True])
@pytest.mark.parametrize("method", ["iql", "vdn", "qmix"])
def test_an_agent_that_left_lends_no_value_to_the_target(method, double_q):
    q, loss = make_loss(method, double_q=double_q)
    data = absent_agent_batch(terminal=False)
    value = loss(data.clone())["loss"].item()
    moved = data.clone()
    moved["next", "agents", "observation"][:, 1] = torch.randn(9, 2) * 10
    assert loss(moved)["loss"].item() == pytest.approx(value)
    moved["next", "agents", "observation"][:, 0] = torch.randn(9, 2) * 10  # agent 0 stayed: its value counts
    assert loss(moved)["loss"].item() != pytest.approx(value)


def continuing_batch():
    """Climbing's nine transitions, none of them the episode's last, each agent's next observation random."""
    data = every_joint_action(climbing_game())
    for key in ("done", "terminated"):
        data["next", key].zero_()
    data["next", "agents", "observation"] = torch.randn(9, 2, 2)
    return data


@pytest.mark.parametrize("method", ["vdn", "qmix"])
def test_double_q_is_the_plain_target_while_online_and_target_networks_agree(method):
    data = continuing_batch()
    plain, double = make_loss(method)[1], make_loss(method, double_q=True)[1]  # same seed: the same weights
    plain_data, double_data = data.clone(), data.clone()
    assert double(double_data)["loss"].item() == pytest.approx(plain(plain_data)["loss"].item(), rel=1e-6)
    assert double_data["td_error"].allclose(plain_data["td_error"])


def test_double_q_values_the_online_networks_greedy_actions_with_the_target_network():
    q, loss = make_loss("vdn", double_q=True)
    with torch.no_grad():
        for param in q.parameters():  # the online network moves away from its target copy
            param.add_(torch.randn_like(param))
    data = continuing_batch()
    with torch.no_grad():
        greedy = q(data["next"].clone())["agents", "action"]  # [9, 2], the online network's choice
        with loss.target_local_value_network_params.to_module(loss.local_value_network):
            target_values = loss.local_value_network(data["next"].clone())["agents", "action_value"]
        target = data["next", "reward"] + 0.99 * target_values.gather(-1, greedy.unsqueeze(-1)).sum(-2)
        chosen = q(data.clone())["agents", "action_value"].gather(-1, data["agents", "action"].unsqueeze(-1))
        expected = (chosen.sum(-2) - target).pow(2).mean()
        assert not target_values.argmax(-1).equal(greedy)  # otherwise this would not tell double-Q apart
    assert loss(data.clone())["loss"].item() == pytest.approx(expected.item(), rel=1e-5)
