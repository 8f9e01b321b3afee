"""Seeding and RNG capture: the same numbers after restore, from every generator, through torch.save."""

import io
import random

import numpy as np
import pytest
import torch

from tdrl.utils.seeding import rng_state, seed_everything, set_rng_state, spawn_seeds


def _draw() -> tuple:
    return (
        random.random(),
        float(np.random.rand()),
        float(np.random.randn()),
        torch.rand(3).tolist(),
    )


def test_seed_everything_makes_all_generators_repeat():
    seed_everything(123)
    a = _draw()
    seed_everything(123)
    assert _draw() == a
    seed_everything(124)
    assert _draw() != a


def test_rng_state_roundtrip_through_torch_save_weights_only():
    seed_everything(7)
    np.random.randn()  # leaves a cached gaussian in numpy's legacy state, which must be captured too
    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    expected = _draw()
    _draw()  # move every generator on
    buf.seek(0)
    set_rng_state(torch.load(buf, weights_only=True))
    assert _draw() == expected


def test_set_rng_state_rejects_foreign_dict():
    with pytest.raises(KeyError, match="numpy"):
        set_rng_state({"python": random.getstate(), "torch": torch.get_rng_state()})


def test_spawn_seeds_reproducible_and_distinct():
    seeds = spawn_seeds(0, 8)
    assert seeds == spawn_seeds(0, 8)
    assert len(set(seeds)) == 8
    assert seeds != spawn_seeds(1, 8)
    assert all(0 <= s < 2**32 for s in seeds)


def test_seed_everything_rejects_non_int():
    with pytest.raises(TypeError, match="seed"):
        seed_everything("3")  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rng_state_roundtrip():
    seed_everything(11)
    state = rng_state()
    assert len(state["cuda"]) == torch.cuda.device_count()
    expected = torch.rand(4, device="cuda")
    torch.rand(10, device="cuda")
    set_rng_state(state)
    assert torch.equal(torch.rand(4, device="cuda"), expected)


def test_unseeded_replay_sampling_follows_torch_manual_seed(tmp_path):
    from tensordict import TensorDict

    from tdrl.replay import TransitionReplayBuffer

    batch = TensorDict({"observation": torch.arange(64.0).reshape(4, 16, 1), "action": torch.zeros(4, 16, 1),
                        "next": {"observation": torch.arange(64.0).reshape(4, 16, 1) + 1,
                                 "reward": torch.ones(4, 16, 1), "done": torch.zeros(4, 16, 1, dtype=torch.bool),
                                 "terminated": torch.zeros(4, 16, 1, dtype=torch.bool),
                                 "truncated": torch.zeros(4, 16, 1, dtype=torch.bool)}}, batch_size=[4, 16])
    drawn = []
    for run in range(3):
        torch.manual_seed(0 if run < 2 else 1)
        replay = TransitionReplayBuffer(tmp_path / f"replay{run}", capacity=256)
        replay.extend(batch)
        drawn.append(replay.sample(32)["observation"])
    assert torch.equal(drawn[0], drawn[1]) and not torch.equal(drawn[0], drawn[2])
