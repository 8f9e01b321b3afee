"""TorchRL transforms: applied by TorchRL inside its envs (the ``torchrl`` kind); tdrl's kinds refuse them."""

from __future__ import annotations

import pytest
import torch
from collect_helpers import StairsFactory, mlp_policy
from torchrl.envs import Compose, ObservationNorm, RewardScaling

from tdrl.collect import make_collector

pytestmark = pytest.mark.timeout(90)


def _norm_and_scale():
    return Compose(
        ObservationNorm(loc=torch.tensor([1.0, 0.0]), scale=torch.tensor([2.0, 1.0]), in_keys=["observation"],
                        standard_normal=True),
        RewardScaling(loc=0.0, scale=10.0),
    )


def test_torchrl_kind_applies_the_transform_in_its_envs():
    with make_collector("torchrl", StairsFactory(length=4), mlp_policy(2, 2, True), batch_B=2, batch_T=8, n_workers=1,
                        transform=_norm_and_scale()) as c:
        batch = c.collect()
    raw = batch["next", "reward"][0, :, 0] / 10  # scaled by 10
    assert set(raw.tolist()) <= {0.0, 1.0, 2.0, 4.0} and raw.abs().sum() > 0
    k_next = batch["next", "observation"][0, :, 0] * 2 + 1  # (k - 1) / 2 undone: the stairs' step counter
    assert torch.equal(k_next, k_next.round()) and k_next.min() >= 1 and k_next.max() <= 4


@pytest.mark.parametrize("kind", ["serial", "parallel", "action_server"])
def test_tdrl_kinds_refuse_a_transform_naming_the_way(kind):
    with pytest.raises(ValueError, match="kind='torchrl'.*gymnasium wrapper"):
        make_collector(kind, StairsFactory(length=4), None, batch_B=2, batch_T=8, n_workers=2,
                       transform=_norm_and_scale())


def test_dict_observations_are_refused_clearly():
    import gymnasium as gym

    from tdrl.envs.make import EnvSpecs

    class DictFactory:
        def __call__(self, seed=None):
            return gym.make("CartPole-v1")

        def specs(self):
            env = gym.wrappers.TransformObservation(
                gym.make("CartPole-v1"), lambda o: {"x": o},
                gym.spaces.Dict({"x": gym.make("CartPole-v1").observation_space}))
            return EnvSpecs.from_env(env)

    with pytest.raises(TypeError, match="FlattenObservation"):
        make_collector("serial", DictFactory(), None, batch_B=1, batch_T=2)
