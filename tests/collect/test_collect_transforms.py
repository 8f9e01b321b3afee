"""TorchRL transforms applied batched by the collectors."""

from __future__ import annotations

import pytest
import torch
from collect_helpers import StairsFactory, stairs_return
from torchrl.envs import (
    CatFrames,
    Compose,
    DTypeCastTransform,
    ObservationNorm,
    RewardScaling,
    UnsqueezeTransform,
    VecNormV2,
)

from tdrl.collect import make_collector

pytestmark = pytest.mark.timeout(90)


def _norm_and_scale():
    return Compose(
        ObservationNorm(loc=torch.tensor([1.0, 0.0]), scale=torch.tensor([2.0, 1.0]), in_keys=["observation"],
                        standard_normal=True),
        RewardScaling(loc=0.0, scale=10.0),
    )


def test_observation_norm_and_reward_scaling_serial():
    factory = StairsFactory(length=4)
    with make_collector("serial", factory, None, batch_B=2, batch_T=8, transform=_norm_and_scale()) as c:
        batch = c.collect()
        infos = c.traj_infos
    k_obs = torch.tensor([0, 1, 2, 3] * 2, dtype=torch.float32)
    k_next = torch.tensor([1, 2, 3, 4] * 2, dtype=torch.float32)
    assert torch.allclose(batch["observation"][0, :, 0], (k_obs - 1) / 2)
    assert torch.allclose(batch["next", "observation"][0, :, 0], (k_next - 1) / 2)
    raw = torch.tensor([1.0, 2.0, 0.0, 4.0] * 2)
    assert torch.allclose(batch["next", "reward"][0, :, 0], raw * 10)
    # Episode statistics use the env's own reward, not the scaled one.
    assert infos and all(i["Return"] == pytest.approx(stairs_return(4, 0.99)[0]) for i in infos)


@pytest.mark.parametrize("kind", ["parallel", "action_server"])
def test_transforms_in_workers_match_serial(kind):
    kwargs = dict(batch_B=4, batch_T=10, seed=0, max_decorrelation_steps=5)
    with make_collector("serial", StairsFactory(length=6), None, transform=_norm_and_scale(), **kwargs) as c:
        expected = c.collect()
    with make_collector(kind, StairsFactory(length=6), None, transform=_norm_and_scale(), n_workers=2, **kwargs) as c:
        got = c.collect()
    assert (got == expected).all()


def test_shape_and_dtype_changing_transform_is_probed():
    cast = Compose(DTypeCastTransform(torch.float32, torch.float64, in_keys=["observation"]),
                   UnsqueezeTransform(-1, in_keys=["observation"]))
    with make_collector("serial", StairsFactory(length=3), None, batch_B=1, batch_T=6, transform=cast) as c:
        batch = c.collect()
    assert batch["observation"].shape == (1, 6, 2, 1) and batch["observation"].dtype == torch.float64
    assert batch["next", "observation"].shape == (1, 6, 2, 1)
    assert batch["observation"][0, :, 0, 0].tolist() == [0, 1, 2, 0, 1, 2]


def test_per_env_stateful_transform_is_refused_clearly():
    with pytest.raises(TypeError, match="CatFrames cannot be applied"):
        make_collector("serial", StairsFactory(), None, batch_B=1, batch_T=2,
                       transform=CatFrames(N=2, dim=-1, in_keys=["observation"]))


def test_vecnorm_statistics_update_batched():
    vecnorm = VecNormV2(in_keys=["observation"], decay=0.9, reduce_batch_dims=True)
    with make_collector("serial", StairsFactory(length=50), None, batch_B=4, batch_T=20, transform=vecnorm) as c:
        batch = c.collect()
    assert torch.isfinite(batch["observation"]).all()
    # Normalised by running statistics: late observations are no longer the raw step counts.
    assert batch["next", "observation"][:, -1, 0].abs().max() < 19


def test_serial_state_dict_carries_transform_statistics():
    def make():
        return make_collector("serial", StairsFactory(length=50), None, batch_B=2, batch_T=10,
                              transform=VecNormV2(in_keys=["observation"], decay=0.9, reduce_batch_dims=True))

    with make() as c:
        c.collect()
        state = c.state_dict()
    with make() as fresh:
        fresh.load_state_dict(state)
        assert fresh.frames == 20
        restored = fresh.state_dict()["transform"]
    torch.testing.assert_close(restored, state["transform"], rtol=0, atol=0)


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
