"""The parts of trainer.kind=ray that need no cluster: the wire format, Ape-X's epsilons and initial priorities."""

import math
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdrl.collect import make_collector
from tdrl.distributed import module_path
from tdrl.distributed.ray_actors import from_wire, nbytes, to_wire
from tdrl.envs import EnvFactory
from tdrl.models import ApexEpsilons, EpsilonGreedy, chain_policy, make_q_actor
from tdrl.models.exploration import apex_epsilon
from tdrl.objectives.dqn import ActorPriorities, dqn_priorities, make_dqn_loss


def test_the_wire_format_round_trips_nested_keys_and_dtypes():
    td = TensorDict({"observation": torch.randn(2, 3, 4), "action": torch.tensor([[0, 1, 1], [1, 0, 0]]),
                     "next": {"done": torch.zeros(2, 3, 1, dtype=torch.bool), "reward": torch.ones(2, 3, 1)}},
                    batch_size=[2, 3])
    back = from_wire(to_wire(td))
    assert back.batch_size == td.batch_size and set(back.keys(True, True)) == set(td.keys(True, True))
    assert (back == td).all() and back["next", "done"].dtype == torch.bool
    assert nbytes(td) == 2 * 3 * 4 * 4 + 6 * 8 + 6 + 6 * 4


def test_apex_epsilons_follow_the_paper_and_stay_fixed():
    assert [round(apex_epsilon(i, 4), 6) for i in range(4)] == [0.4, round(0.4 ** (1 + 7 / 3), 6),
                                                                round(0.4 ** (1 + 14 / 3), 6), round(0.4 ** 8, 6)]
    assert apex_epsilon(0, 1) == 0.4
    policy = chain_policy(make_q_actor(EnvFactory("CartPole-v1").specs(), hidden_sizes=[8]),
                          EpsilonGreedy(2, eps_init=1.0, eps_final=0.05, end_frames=100))
    ApexEpsilons()(policy, 3, 4)
    explore = next(m for m in policy.modules() if isinstance(m, EpsilonGreedy))
    explore.set_frames(10_000)  # a schedule no longer moves it
    assert math.isclose(explore.eps.item(), 0.4 ** 8, rel_tol=1e-6)
    with pytest.raises(ValueError, match="no EpsilonGreedy"):
        ApexEpsilons()(torch.nn.Linear(2, 2), 0, 4)


@pytest.mark.parametrize("n_step", [1, 3])
def test_actor_priorities_equal_the_learners_td_errors_of_the_same_network(n_step):
    """1-step: the learner's |TD error| with a target network equal to the online one. n-step: the same target
    computed by hand for every start of the batch, shorter at its end and cut at episode ends."""
    torch.manual_seed(0)
    env = EnvFactory("CartPole-v1")
    q = make_q_actor(env.specs(), hidden_sizes=[16])
    policy = chain_policy(q, EpsilonGreedy(2, eps_init=1.0, eps_final=1.0))
    collector = make_collector("serial", env, policy, batch_B=2, batch_T=40, seed=0)
    batch = next(iter(collector))
    collector.shutdown()
    assert batch["next", "done"].any()  # the batch crosses an episode end
    priorities = ActorPriorities(gamma=0.9, n_step=n_step, q_path=module_path(policy, q), delta_clip=None)(
        policy, batch)
    assert priorities.shape == (2, 40)
    with torch.no_grad():
        q_all = q(batch.select("observation").clone())["action_value"]
        v_next = q(batch["next"].select("observation").clone())["action_value"].max(-1).values
    reward, done = batch["next", "reward"].squeeze(-1), batch["next", "done"].squeeze(-1)
    terminated = batch["next", "terminated"].squeeze(-1).float()
    for b in range(2):
        for t in range(40):
            ret, k = 0.0, t
            while True:
                ret += 0.9 ** (k - t) * reward[b, k].item()
                if done[b, k] or k == min(t + n_step, 40) - 1:
                    break
                k += 1
            target = ret + 0.9 ** (k - t + 1) * v_next[b, k].item() * (1 - terminated[b, k].item())
            expected = abs(target - q_all[b, t, batch["action"][b, t]].item())
            assert math.isclose(priorities[b, t].item(), expected, rel_tol=1e-4, abs_tol=1e-5), (b, t)
    if n_step == 1:
        loss = make_dqn_loss(q, gamma=0.9, loss_function="mse")  # target network = online network at the start
        flat = batch.reshape(-1).clone()
        loss(flat)
        assert torch.allclose(dqn_priorities(flat, categorical=False, delta_clip=None), priorities.reshape(-1),
                              atol=1e-5)


def test_an_unreachable_cluster_fails_in_seconds_with_one_line():
    import socket
    import time

    from tdrl.distributed.ray_connect import RayUnreachableError, check_reachable
    from tdrl.utils.errors import UserError

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(RayUnreachableError, match=f"trainer.ray_address=127.0.0.1:{port}: no Ray cluster") as info:
        check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)
    assert isinstance(info.value, UserError) and time.monotonic() - start < 5


def test_a_recipe_pointed_at_no_cluster_fails_before_building_anything(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "dqn.py"
    proc = subprocess.run([sys.executable, str(recipe), "trainer.kind=ray", f"trainer.ray_address=127.0.0.1:{port}",
                           f"run.root={tmp_path / 'runs'}", "logger.wandb=false"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: trainer.ray_address=127.0.0.1:{port}: no Ray cluster answers there ([Errno 111] Connection refused); "
        "start one with `ray start --head` or leave the address empty for a local Ray"], proc.stderr
    assert not (tmp_path / "runs").exists()  # no run directory, no evaluation: nothing was built


def test_a_recipe_gets_ray_only_where_it_names_it():
    """A recipe's trainer section names its kinds (PPO's has no ray: no lag correction); a kind passed in code that
    the section does not name is refused as one the recipe does not wire up."""
    from tdrl.config import ConfigError, ImpalaTrainerConfig, OnPolicyTrainerConfig
    from tdrl.wiring import check_trainer

    with pytest.raises(ConfigError, match="trainer.kind=ray is not wired up in this recipe; it supports sync, ddp"):
        check_trainer(OnPolicyTrainerConfig(kind="ray"), on_policy=True)  # type: ignore[arg-type]
    check_trainer(ImpalaTrainerConfig(kind="ray"), on_policy=True)  # IMPALA
