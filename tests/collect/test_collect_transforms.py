"""TorchRL transforms: inside TorchRL's envs (the ``torchrl`` kind), batched on the step arrays (tdrl's kinds)."""

from __future__ import annotations

import time

import pytest
import torch
from collect_helpers import StairsFactory, mlp_policy
from torchrl.envs import (
    CatFrames,
    Compose,
    InitTracker,
    ObservationNorm,
    RewardScaling,
    RewardSum,
    StepCounter,
    Transform,
    VecNorm,
)

from tdrl.collect import COLLECTOR_KINDS, CollectorError, make_collector
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


RESUMED = {  # transform, observation size the policy sees
    "VecNorm": (lambda: VecNorm(in_keys=["observation"]), 4),  # its statistics travel in the slice's state
    "env protocol": (lambda: Compose(StepCounter(max_steps=40), RewardSum(),
                                     CatFrames(N=3, dim=-1, in_keys=["observation"])), 12),
}


@pytest.mark.parametrize("name", list(RESUMED))
@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_transforms_resume_bitwise(kind, name, tmp_path):
    make_transform, obs_size = RESUMED[name]

    def build():
        return make_collector(kind, EnvFactory("CartPole-v1"), mlp_policy(obs_size, 2, True), batch_B=4, batch_T=30,
                              n_workers=2, transform=make_transform())

    with build() as c:
        c.collect()
        torch.save(c.state_dict(), tmp_path / "state.pt")
        expected = [c.collect() for _ in range(2)]
    with build() as c:
        c.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
        for want in expected:
            assert (c.collect() == want).all()


class AddOne(Transform):
    """A user's own transform: observation + 1 (TorchRL's documented way to write one)."""

    def __init__(self) -> None:
        super().__init__(in_keys=["observation"], out_keys=["observation"])

    def _apply_transform(self, obs: torch.Tensor) -> torch.Tensor:
        return obs + 1

    def _reset(self, tensordict, tensordict_reset):
        return self._call(tensordict_reset)


TRANSFORMS = {
    "VecNorm": lambda: VecNorm(in_keys=["observation"]),
    "StepCounter": lambda: StepCounter(max_steps=3),
    "RewardSum": RewardSum,
    "CatFrames": lambda: CatFrames(N=3, dim=-1, in_keys=["observation"]),
    "InitTracker": InitTracker,
    "own": AddOne,
}


@pytest.mark.timeout(60)  # a hang fails here, well inside the suite's limit
@pytest.mark.parametrize("name", list(TRANSFORMS))
@pytest.mark.parametrize("kind", [k for k in COLLECTOR_KINDS if k != "batched_env"])  # it refuses transforms
def test_every_kind_runs_every_transform(kind, name):
    """Every collector kind runs the stateful TorchRL transforms and a user's own, batched, with their meaning:
    StepCounter ends episodes at 3 steps, RewardSum sums them, CatFrames stacks 3 observations."""
    with make_collector(kind, StairsFactory(length=4), mlp_policy(6 if name == "CatFrames" else 2, 2, True),
                        batch_B=4, batch_T=12, n_workers=2 if kind != "serial" else 1,
                        transform=TRANSFORMS[name]()) as c:
        batch = c.collect()
        batch = c.collect()
        lengths = {info["Length"] for info in c.traj_infos}
    obs, nxt = batch["observation"], batch["next"]
    assert obs.shape == (4, 12, 6 if name == "CatFrames" else 2)
    if name == "StepCounter":
        assert nxt["step_count"].max() == 3 and lengths == {3}  # truncated before the stairs' end at 4
    if name == "RewardSum":
        ended = nxt["done"][..., 0]
        assert torch.equal(nxt["episode_reward"][ended][:, 0], torch.full((int(ended.sum()),), 7.0))
    if name == "CatFrames" and kind != "torchrl":  # newest frame last: the policy saw the stack the step returned
        assert torch.equal(obs[:, 1:, -2:][~batch["is_init"][:, 1:, 0]],
                           nxt["observation"][:, :-1, -2:][~batch["is_init"][:, 1:, 0]])
    if name == "own":
        assert obs[..., 0].min() == 1  # the stairs' counter starts at 0


def test_step_counter_truncation_resets_the_env_in_tdrl_kinds():
    with make_collector("serial", EnvFactory("CartPole-v1"), mlp_policy(4, 2, True), batch_B=2, batch_T=20,
                        transform=StepCounter(max_steps=7)) as c:
        batch = c.collect()
        assert {info["Length"] for info in c.traj_infos} <= set(range(1, 8))
    truncated = batch["next", "truncated"][..., 0]
    assert truncated.any() and bool(batch["is_init"][:, 1:][truncated[:, :-1]].all())  # reset after truncation


class Fails(AddOne):
    def _apply_transform(self, obs):
        if obs.abs().max() > 2:
            raise RuntimeError("transform broke")
        return obs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["parallel", "action_server"])
def test_a_transform_that_raises_in_a_worker_ends_the_run(kind):
    start = time.monotonic()
    with pytest.raises(CollectorError, match="transform broke"):
        with make_collector(kind, StairsFactory(length=4), None, batch_B=2, batch_T=8, n_workers=2,
                            transform=Fails()) as c:
            c.collect()
    assert time.monotonic() - start < 20


def test_dict_observations_with_a_transform_are_refused_clearly():
    """tdrl's kinds collect dict observations (tests/collect/test_collect_grouped.py), but not through a
    transform yet: one line saying so."""
    from grouped_helpers import MaskedWalkFactory

    with pytest.raises(ValueError, match="transform= needs an env with an array observation"):
        make_collector("serial", MaskedWalkFactory(), None, batch_B=1, batch_T=2,
                       transform=VecNorm(in_keys=["observation"]))


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
