"""recipes/mappo.py's agent mask: rows of an agent that left the episode (``(group, "mask")`` False) change nothing
in MAPPO's or IPPO's gradient, through the policy, value and entropy terms and the advantage statistics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict.nn import TensorDictSequential

from tdrl.collect import make_collector
from tdrl.config import apply_overrides
from tdrl.launch.recipe import load_recipe
from tests.collect.grouped_helpers import LeavingFactory

mappo = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "mappo.py")
GROUPS = ("walker", "scout")  # walker_1 leaves after step 2, scout_0 after step 3, the episode ends after step 4


def _losses(algorithm: str) -> dict:
    cfg = apply_overrides(mappo.Config(), [f"loss.algorithm={algorithm}", "model.hidden_sizes=[8]"])
    specs = LeavingFactory().specs()
    obs, actions = specs.observation_spec, specs.action_spec
    torch.manual_seed(0)
    losses = {}
    for g in GROUPS:
        actor = mappo.group_actor(g, obs[g, "observation"], actions[g, "action"], cfg.model, masked=False)
        critic = mappo.group_critic(g, obs[g, "observation"], cfg.model, centralised=algorithm == "mappo")
        losses[g] = mappo.group_loss(g, actor, critic, cfg)
    return losses


def _collect(losses):
    """One batch of the leaving-agents env, acted by the losses' actors."""
    policy = TensorDictSequential(*(loss.actor_network for loss in losses.values()))
    with make_collector("serial", LeavingFactory(), policy, batch_B=2, batch_T=8, seed=0) as collector:
        return collector.collect()


def _gradient(batch, losses, standardize: bool = True) -> list[torch.Tensor]:
    batch = batch.clone()
    mappo.advantages(batch, losses, standardize)
    data = batch.reshape(-1)
    total = sum(value for g in GROUPS for key, value in losses[g](data).items() if key.startswith("loss_"))
    params = [p for loss in losses.values() for p in loss.parameters()]
    return list(torch.autograd.grad(total, params, allow_unused=True))


def _scramble_absent(batch):
    """The batch with every absent agent's row changed: its reward, action and the log-probability it was
    sampled with."""
    out = batch.clone()
    for g in GROUPS:
        absent = ~out[g, "mask"]
        out["next", g, "reward"][absent] += 1000.0
        out[g, "action"][absent] = 1 - out[g, "action"][absent]
        out[g, "action_log_prob"][absent] -= 5.0
    return out


@pytest.mark.parametrize(("algorithm", "standardize"), [("mappo", True), ("ippo", True), ("mappo", False)])
def test_absent_agents_change_nothing_in_the_gradient(algorithm, standardize):
    losses = _losses(algorithm)
    batch = _collect(losses)
    assert (~batch["walker", "mask"]).any() and (~batch["scout", "mask"]).any()
    scrambled = _scramble_absent(batch)
    expected = _gradient(batch, losses, standardize)
    got = _gradient(scrambled, losses, standardize)
    assert all(g is not None for g in expected)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    for loss in losses.values():  # the check can fail: TorchRL's default masks count the absent rows
        loss.loss_mask_key = "auto"
    assert not all(torch.equal(a, b) for a, b in zip(_gradient(batch, losses, standardize),
                                                     _gradient(scrambled, losses, standardize), strict=True))


def test_normalize_advantage_false_keeps_gae_advantages():
    """``loss.normalize_advantage=false`` (BenchMARL's setting) leaves MultiAgentGAE's advantages as they are; the
    default standardises them per agent over its present rows."""
    losses = _losses("ippo")
    batch = _collect(losses)
    raw, standardized = batch.clone(), batch.clone()
    mappo.advantages(raw, losses, standardize=False)
    mappo.advantages(standardized, losses)
    for g in GROUPS:
        assert not torch.allclose(raw[g, "advantage"], standardized[g, "advantage"])
        torch.testing.assert_close(standardized[g, "advantage"],
                                   mappo.standardize_present(raw[g, "advantage"], raw[g, "mask"]))


def test_standardize_present():
    """Per agent over the present rows, as TorchRL standardises all rows (unbiased std); absent rows are 0."""
    torch.manual_seed(0)
    adv = torch.randn(50, 3, 1) * torch.tensor([1.0, 10.0, 0.1]).view(3, 1) + 4.0
    every = mappo.standardize_present(adv, torch.ones(50, 3, dtype=torch.bool))
    torch.testing.assert_close(every, (adv - adv.mean(0)) / adv.std(0))
    present = torch.rand(50, 3) < 0.7
    got = mappo.standardize_present(torch.where(present.unsqueeze(-1), adv, torch.full_like(adv, 1e6)), present)
    for j in range(3):
        rows = adv[present[:, j], j]
        torch.testing.assert_close(got[present[:, j], j], (rows - rows.mean()) / rows.std())
    assert (got[~present] == 0).all()
