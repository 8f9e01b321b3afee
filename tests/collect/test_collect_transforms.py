"""TorchRL transforms: inside TorchRL's envs (the ``torchrl`` kind), batched on the step arrays (tdrl's kinds)."""

from __future__ import annotations

import pytest
import torch
from collect_helpers import StairsFactory, mlp_policy
from torchrl.envs import Compose, ObservationNorm, RewardScaling, StepCounter, VecNorm

from tdrl.collect import make_collector
from tdrl.envs import EnvFactory

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


@pytest.mark.parametrize("kind", ["serial", "parallel", "action_server", "alternating"])
def test_tdrl_kinds_apply_the_transform_to_each_step(kind):
    with make_collector(kind, StairsFactory(length=4), mlp_policy(2, 2, True), batch_B=4, batch_T=8, n_workers=1,
                        transform=_norm_and_scale()) as c:
        batch = c.collect()
        returns = {info["Return"] for info in c.traj_infos}
    assert returns == {7.0}  # TrajInfos: the env's raw rewards 1 + 2 + 0 + 4
    assert set(batch["next", "reward"].unique().tolist()) == {0.0, 10.0, 20.0, 40.0}
    k = batch["observation"][..., 0] * 2 + 1  # what the policy saw: (k - 1) / 2, from k = 0 at reset
    assert torch.equal(k, k.round()) and k.min() == 0 and k.max() == 3
    assert torch.equal(batch["next", "observation"][:, :-1], torch.where(batch["is_init"][:, 1:], batch["next",
                       "observation"][:, :-1], batch["observation"][:, 1:]))


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_vecnorm_statistics_resume_bitwise(kind, tmp_path):
    def build():
        return make_collector(kind, EnvFactory("CartPole-v1"), mlp_policy(4, 2, True), batch_B=4, batch_T=30,
                              n_workers=2, transform=VecNorm(in_keys=["observation"]))

    with build() as c:
        c.collect()
        torch.save(c.state_dict(), tmp_path / "state.pt")
        expected = [c.collect() for _ in range(2)]
    with build() as c:
        c.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
        for want in expected:
            got = c.collect()
            for key in ("observation", ("next", "observation"), ("next", "reward")):
                assert torch.equal(got[key], want[key]), key


def test_a_transform_that_needs_the_env_protocol_is_refused_in_one_line():
    with pytest.raises(ValueError, match="StepCounter.*kind='torchrl'") as err:
        make_collector("serial", StairsFactory(length=4), None, batch_B=2, batch_T=8, transform=StepCounter())
    assert "\n" not in str(err.value)


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


class _Seen(torch.nn.Module):
    """Action 0 always; keeps every observation it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.seen.append(obs.clone())
        return torch.zeros(obs.shape[0], dtype=torch.long)


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_evaluation_sees_observations_through_the_training_transform_frozen(kind):
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule

    from tdrl.collect import make_eval_collector

    raw, normed = _Seen(), _Seen()
    with make_collector(kind, EnvFactory("CartPole-v1"), mlp_policy(4, 2, True), batch_B=4, batch_T=30, n_workers=2,
                        transform=VecNorm(in_keys=["observation"])) as train:
        for _ in range(2):
            train.collect()
            state = train.transform_state()
            frozen = VecNorm(in_keys=["observation"])
            frozen.load_state_dict(state)
            frozen = frozen.frozen_copy()
            raw.seen.clear(), normed.seen.clear()
            for module, of in ((raw, None), (normed, train)):  # the same seed and actions: the same episodes
                with make_eval_collector("CartPole-v1", TensorDictModule(module, ["observation"], ["action"]),
                                         n_envs=2, seed=7, observations_of=of) as evaluator:
                    evaluator.evaluate()
            steps = 2 * 500  # the evaluation's calls (2 envs x CartPole's 500-step limit); the build's come before
            seen_raw, seen_normed = torch.cat(raw.seen)[-steps:], torch.cat(normed.seen)[-steps:]
            want = frozen(TensorDict({"observation": seen_raw}, seen_raw.shape[:1]))["observation"]
            assert torch.allclose(seen_normed, want) and not torch.allclose(seen_normed, seen_raw)
            after = train.transform_state()  # evaluating left worker 0's statistics as they were
            assert all(torch.equal(a, b) for a, b in zip(after["_extra_state"].values(),
                                                         state["_extra_state"].values(), strict=True))
