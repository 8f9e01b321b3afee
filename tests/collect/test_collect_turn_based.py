"""Turn-based PettingZoo envs (AEC: tictactoe, connect four) through tdrl's collectors, one AEC turn per step
(tdrl.envs.turn_based): the batches equal stepping the AEC env by hand, rewards that arrive on the opponent's turn
are neither lost nor counted twice, masked actions never reach the env, and a collector resumes mid-game."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tdrl.collect import make_collector
from tdrl.collect.stepping import env_seed
from tdrl.envs import EnvFactory
from tdrl.envs.turn_based import IllegalActionError

pytest.importorskip("pettingzoo")

from pettingzoo.classic import tictactoe_v3  # noqa: E402

TICTACTOE = EnvFactory("pettingzoo/classic/tictactoe_v3")
PLAYERS = ["player_1", "player_2"]


def _assert_same(a, b):
    assert a.batch_size == b.batch_size and set(a.keys(True, True)) == set(b.keys(True, True))
    diff = [k for k in a.keys(True, True) if not torch.equal(a.get(k), b.get(k))]
    assert not diff, f"keys differ: {diff}"


def _check_turn(row, aec, t):
    """Row ``t`` of one env's batch against the AEC env before its turn: whose turn, observations, action masks."""
    acting = aec.agent_selection
    assert row["player", "mask"][t].tolist() == [a == acting for a in PLAYERS], t
    for j, agent in enumerate(PLAYERS):
        seen = aec.observe(agent)
        np.testing.assert_array_equal(row["player", "observation"][t, j].numpy(), seen["observation"].reshape(-1))
        legal = seen["action_mask"].astype(bool) if agent == acting else np.ones(9, bool)
        np.testing.assert_array_equal(row["player", "action_mask"][t, j].numpy(), legal)
    return PLAYERS.index(acting)


def _by_hand(batch, seed):
    """Step each env of the batch by hand (PettingZoo's AEC API) with the acting player's stored action and check
    every entry; the finished games' actions, for the reward check."""
    B, T = batch.batch_size
    games = []
    for i in range(B):
        row, aec = batch[i], tictactoe_v3.env()
        aec.reset(seed=env_seed(seed, i))
        moves = []
        for t in range(T):
            j = _check_turn(row, aec, t)
            action = int(row["player", "action"][t, j])
            assert aec.observe(PLAYERS[j])["action_mask"][action], "an illegal move reached the env"
            aec.step(action)
            moves.append(action)
            for k, agent in enumerate(PLAYERS):
                np.testing.assert_array_equal(row["next", "player", "observation"][t, k].numpy(),
                                              aec.observe(agent)["observation"].reshape(-1))
            assert row["next", "player", "reward"][t, :, 0].tolist() == [aec.rewards[a] for a in PLAYERS]
            done = [aec.terminations[a] or aec.truncations[a] for a in PLAYERS]
            assert row["next", "player", "done"][t, :, 0].tolist() == done
            assert bool(row["next", "done"][t, 0]) == all(done) == bool(row["next", "terminated"][t, 0])
            if all(done):
                assert not row["next", "player", "mask"][t].any()
                games.append((moves, row["next", "player", "reward"][t - len(moves) + 1:t + 1, :, 0].sum(0)))
                moves = []
                aec.reset()
    return games


def _aec_returns(moves):
    """Each player's return over a game as PettingZoo's own loop hands it out: ``last()``'s cumulative rewards,
    dead steps included."""
    aec, returns, moves = tictactoe_v3.env(), dict.fromkeys(PLAYERS, 0.0), list(moves)
    aec.reset()
    for agent in aec.agent_iter():
        _, reward, term, trunc, _ = aec.last()
        returns[agent] += reward
        aec.step(None if term or trunc else moves.pop(0))
    assert not moves
    return [returns[a] for a in PLAYERS]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_tictactoe_matches_the_aec_env(kind):
    """A random (masked) policy's tictactoe games through the serial and parallel collectors: every observation,
    whose turn it is, action mask, reward and done flag as stepping the AEC env by hand gives them, each legal;
    each player's return per game is what PettingZoo's ``last()`` hands it, a loser's -1 included, which arrives on
    the winner's turn (a row where the loser is masked)."""
    kwargs = dict(batch_B=2, batch_T=40, seed=4)
    with make_collector("serial", TICTACTOE, None, **kwargs) as serial:
        batch = serial.collect()
    if kind == "parallel":
        with make_collector(kind, TICTACTOE, None, n_workers=2, **kwargs) as c:
            _assert_same(batch, c.collect())
    assert batch["player", "observation"].shape == (2, 40, 2, 18) and batch["player", "mask"].dtype == torch.bool
    assert (batch["player", "mask"].sum(-1) == 1).all()  # one player's turn each step
    games = _by_hand(batch, seed=4)
    assert len(games) >= 6
    for moves, returns in games:
        assert returns.tolist() == _aec_returns(moves)
    assert any(r.tolist() == [-1.0, 1.0] for _, r in games)  # player_2 won: player_1's -1 came on its turn
    assert batch["next", "reward"].abs().sum() == 0  # the root reward sums the players': zero-sum


def test_reward_on_the_opponents_turn():
    """A scripted game player_2 wins: player_1's -1 for its last move arrives in the row of player_2's winning
    move, where player_1 is masked, once; the episode ends there, terminated for both."""
    env = TICTACTOE()
    obs, _ = env.reset(seed=0)
    rows = []
    for move in (0, 3, 1, 4, 8, 5):  # player_2 completes the middle row
        j = int(np.flatnonzero(obs["player"]["mask"])[0])
        action = np.zeros(2, np.int64)
        action[j] = move
        obs, reward, terminated, truncated, _ = env.step({"player": {"action": action}})
        rows.append((j, obs["player"]["reward"][:, 0].tolist(), reward, terminated, truncated))
    assert [r[0] for r in rows] == [0, 1, 0, 1, 0, 1]
    assert [r[1] for r in rows] == [[0, 0]] * 5 + [[-1, 1]]
    assert rows[-1][2:] == (0.0, True, False) and not any(r[3] for r in rows[:-1])
    assert obs["player"]["done"][:, 0].tolist() == [True, True] and not obs["player"]["mask"].any()


def test_masked_actions_never_reach_the_env():
    """An action the acting player's mask forbids raises before the env sees it; the other player's action is not
    passed on, whatever it is."""
    env = TICTACTOE()
    env.reset(seed=0)
    env.step({"player": {"action": np.array([4, 7])}})  # player_1 takes the centre; player_2's 7 is ignored
    board = env.env.env.observe("player_1")["observation"].copy()
    assert board.reshape(3, 3, 2)[1, 1].tolist() == [1, 0] and board.sum() == 1
    with pytest.raises(IllegalActionError, match=r"player_2 chose action 4, which its action_mask forbids"):
        env.step({"player": {"action": np.array([0, 4])}})
    np.testing.assert_array_equal(env.env.env.observe("player_1")["observation"], board)


@pytest.mark.timeout(60)
def test_resume_mid_game():
    """A collector restored from another's state_dict in the middle of games continues with the same batches."""
    kwargs = dict(batch_B=2, batch_T=5, seed=7)
    with make_collector("serial", TICTACTOE, None, **kwargs) as c:
        c.collect()
        state = c.state_dict()
        expected = [c.collect() for _ in range(3)]
    with make_collector("serial", TICTACTOE, None, **kwargs) as c:
        c.load_state_dict(state)
        got = [c.collect() for _ in range(3)]
    for a, b in zip(expected, got, strict=True):
        _assert_same(a, b)


def test_connect_four_one_group_per_player():
    """connect_four_v3 with one group per player (TorchRL's default for AEC envs): the players alternate, each
    group's mask says when it is its turn, and a group's observation is there on the other's turns too."""
    factory = EnvFactory("pettingzoo/classic/connect_four_v3", {"group_map": "per_agent"})
    with make_collector("serial", factory, None, batch_B=1, batch_T=30, seed=1) as c:
        batch = c.collect()[0]
    first, second = batch["player_0", "mask"][:, 0], batch["player_1", "mask"][:, 0]
    assert batch["player_0", "observation"].shape == (30, 1, 84) and (first ^ second).all()
    starts = batch["is_init"][:, 0]
    turns = torch.cumsum(starts, 0)  # game index
    for g in turns.unique():
        game = first[turns == g]
        assert game.tolist() == [k % 2 == 0 for k in range(len(game))]  # player_0 moves first, then alternate
    assert batch["next", "done"].any()
    boards = EnvFactory("pettingzoo/classic/connect_four_v3", {"flatten": False}).specs().observation_spec
    assert boards["player", "observation"].shape == (2, 6, 7, 2)  # flatten=False keeps the board


def test_an_env_whose_package_is_missing_says_which():
    """A PettingZoo env that imports a package tdrl[marl] does not install is named as such, not as an unknown id;
    an unknown id names the known envs of its family."""
    from tdrl.envs import EnvError

    with pytest.raises(EnvError, match=r"unknown environment id 'pettingzoo/classic/tictactoe_v9'; pettingzoo\.classic "
                                       r"has .*connect_four_v3.*tictactoe_v3"):
        EnvFactory("pettingzoo/classic/tictactoe_v9")()
    try:
        import chess  # noqa: F401
    except ImportError:
        with pytest.raises(EnvError, match=r"^environment 'pettingzoo/classic/chess_v6' needs the chess package, "
                                           r"which tdrl\[marl\] does not install: pip install chess$"):
            EnvFactory("pettingzoo/classic/chess_v6")()
