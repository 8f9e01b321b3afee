"""Uniform transition replay: n-step targets, cursor safety, flat batches, masks, bad input."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.replay import ReplayError, TransitionReplayBuffer
from tests.replay.helpers import make_stream, reference_nstep


def _decode(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    code = obs[:, 0].long()
    return code // 10_000, code % 10_000


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_nstep_targets_match_hand_computation(tmp_path, n_step):
    B, T, gamma = 3, 240, 0.9
    stream = make_stream(B, T, seed=n_step, done_prob=0.15)
    # capacity of 3 x 80 steps: the ring wraps twice; chunks of 16 put windows across extend boundaries
    rb = TransitionReplayBuffer(tmp_path / "rb", 3 * 80, n_step=n_step, gamma=gamma, seed=1)
    checked = 0
    for start in range(0, T, 16):
        rb.extend(stream[:, start : start + 16])
        n = min(64, rb.ready_count())
        sample = rb.sample(n)
        b, t = _decode(sample["observation"])
        newest = start + 15
        assert int(t.max()) <= newest - (n_step - 1), "a window crossed the write cursor"
        assert int(t.min()) >= max(0, newest + 1 - 80), "sampled an overwritten step"
        for i in range(n):
            ref = reference_nstep(stream, int(b[i]), int(t[i]), n_step, gamma)
            assert float(sample["next", "reward"][i, 0]) == pytest.approx(ref["reward"], rel=1e-5, abs=1e-5)
            assert float(sample["next", "observation"][i, 0]) == ref["next_obs"]
            assert bool(sample["next", "terminated"][i, 0]) == ref["terminated"]
            assert bool(sample["next", "truncated"][i, 0]) == ref["truncated"]
            assert bool(sample["next", "done"][i, 0]) == ref["done"]
            if n_step > 1:
                assert int(sample["steps_to_next_obs"][i, 0]) == ref["k"]
            # start-step keys come from the start step
            assert torch.equal(sample["action"][i], stream["action"][int(b[i]), int(t[i])])
            checked += 1
    assert checked > 0
    if n_step == 1:
        assert "steps_to_next_obs" not in sample.keys()


def test_nstep_window_stops_at_truncation_and_bootstraps_from_final_obs(tmp_path):
    stream = make_stream(1, 10, done_prob=0.0)
    stream["next", "truncated"][0, 4] = True
    stream["next", "done"][0, 4] = True
    rb = TransitionReplayBuffer(tmp_path / "rb", 100, n_step=4, gamma=0.5, seed=0)
    rb.extend(stream)
    seen = set()
    for _ in range(30):
        s = rb.sample(7)
        for i in range(7):
            t = int(s["observation"][i, 0])
            seen.add(t)
            if t in (2, 3, 4):
                k = 5 - t  # window ends at the truncated step 4
                assert int(s["steps_to_next_obs"][i, 0]) == k
                assert float(s["next", "observation"][i, 0]) == 4.5  # final obs of step 4, not the reset obs
                assert bool(s["next", "truncated"][i, 0]) and not bool(s["next", "terminated"][i, 0])
    assert {2, 3, 4} <= seen
    assert max(seen) == 10 - 4  # newest complete window starts at T - n_step


def test_flat_batches_one_step(tmp_path):
    rb = TransitionReplayBuffer(tmp_path / "rb", 50, seed=0)
    flat = make_stream(4, 10).reshape(-1)
    rb.extend(flat)
    rb.extend(flat[:30])
    assert len(rb) == 50 and rb.write_count == 70
    s = rb.sample(32)
    assert s.batch_size == torch.Size([32])
    with pytest.raises(ReplayError, match="flat"):
        TransitionReplayBuffer(tmp_path / "rb2", 50, n_step=3).extend(flat)
    with pytest.raises(ReplayError, match="batch_size"):
        rb.extend(make_stream(4, 10))


def test_grouped_keys_keep_their_agent_dim(tmp_path):
    """Multi-agent groups (docs/design.md §1): ``("agents", ...)`` TensorDicts of batch ``[B, T, n_agents]`` come
    back as ``[n, n_agents]``, each agent's row from the sampled step (``next``: the window's last), also after the
    buffer is restored from a copy."""
    stream = make_stream(2, 30, done_prob=0.0)
    code = stream["observation"][..., :1]  # [B, T, 1]: 10_000 * b + t
    agents = torch.arange(3.0).view(1, 1, 3, 1)  # agent i's value: code + 0.1 * i
    stream["agents"] = TensorDict(observation=code.unsqueeze(-2) + 0.1 * agents, action=torch.randint(0, 5, (2, 30, 3)),
                                  mask=torch.ones(2, 30, 3, dtype=torch.bool), batch_size=[2, 30, 3])
    stream["next", "agents"] = TensorDict(reward=torch.randn(2, 30, 3, 1), batch_size=[2, 30, 3])
    rb = TransitionReplayBuffer(tmp_path / "rb", 60, n_step=2, gamma=0.5, seed=0)
    rb.extend(stream)
    rb.dumps(tmp_path / "dump")
    restored = TransitionReplayBuffer(tmp_path / "restored", 60, n_step=2, gamma=0.5)
    restored.loads(tmp_path / "dump")
    for buffer in (rb, restored):
        s = buffer.sample(16)
        assert s["agents"].batch_size == (16, 3) and s["next", "agents"].batch_size == (16, 3)
        assert s["next"].batch_size == (16,)
        b, t = _decode(s["observation"])
        torch.testing.assert_close(s["agents", "observation"], stream["agents", "observation"][b, t])
        assert torch.equal(s["agents", "action"], stream["agents", "action"][b, t])
        assert torch.equal(s["next", "agents", "reward"], stream["next", "agents", "reward"][b, t + 1])


def test_validity_mask_is_respected(tmp_path):
    stream = make_stream(4, 50)
    mask = torch.rand(4, 50, generator=torch.Generator().manual_seed(0)) < 0.5
    stream["collector", "mask"] = mask
    rb = TransitionReplayBuffer(tmp_path / "rb", 400, seed=0)
    rb.extend(stream)
    for _ in range(10):
        s = rb.sample(64)
        b, t = _decode(s["observation"])
        assert bool(mask[b, t].all())


def _snapshot(rb):
    return {k: v.clone() for k, v in rb.ring.fields.items()}, rb.write_count, len(rb)


def test_bad_input_errors_name_the_field_and_lose_nothing(tmp_path):
    rb = TransitionReplayBuffer(tmp_path / "rb", 200, n_step=2, seed=0)
    good = make_stream(2, 20)
    rb.extend(good)
    before = _snapshot(rb)

    missing = good.exclude(("next", "terminated"))
    with pytest.raises(ReplayError, match="next.terminated"):
        rb.extend(missing)
    wrong_dtype = good.clone()
    wrong_dtype["action"] = wrong_dtype["action"].double()
    with pytest.raises(ReplayError, match="action.*dtype"):
        rb.extend(wrong_dtype)
    wrong_shape = good.clone()
    wrong_shape["observation"] = torch.zeros(2, 20, 4)
    with pytest.raises(ReplayError, match="observation.*shape"):
        rb.extend(wrong_shape)
    extra = good.clone()
    extra["state_value"] = torch.zeros(2, 20, 1)
    with pytest.raises(ReplayError, match="state_value"):
        rb.extend(extra)
    with pytest.raises(ReplayError, match="batch_size"):
        rb.extend(make_stream(3, 20))
    with pytest.raises(ReplayError, match="TensorDict"):
        rb.extend({"observation": torch.zeros(2)})
    assert rb.sample(500).batch_size == (500,)  # with replacement: larger than what the buffer holds

    after = _snapshot(rb)
    assert after[1:] == before[1:]
    for key in before[0]:
        assert torch.equal(before[0][key], after[0][key]), key
    rb.extend(good)  # still usable
    assert rb.write_count == 80


def test_empty_buffer_sample_raises(tmp_path):
    rb = TransitionReplayBuffer(tmp_path / "rb", 100)
    with pytest.raises(ReplayError, match="no transition is ready"):
        rb.sample(1)


def test_samples_feed_torchrl_losses(tmp_path):
    from tensordict.nn import TensorDictModule
    from torchrl.data import OneHot
    from torchrl.modules import QValueActor
    from torchrl.objectives import DQNLoss

    B, T = 2, 40
    stream = make_stream(B, T)
    stream["action"] = torch.nn.functional.one_hot(torch.randint(0, 2, (B, T)), 2)
    rb = TransitionReplayBuffer(tmp_path / "rb", 1000, n_step=3, gamma=0.9, seed=0)
    rb.extend(stream)
    actor = QValueActor(TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["action_value"]),
                        spec=OneHot(2))
    loss = DQNLoss(actor, action_space="one_hot", delay_value=False)
    loss.make_value_estimator(gamma=0.9)
    out = loss(rb.sample(32))
    assert torch.isfinite(out["loss"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_are_stored_on_cpu(tmp_path):
    rb = TransitionReplayBuffer(tmp_path / "rb", 100, n_step=2, seed=0)
    rb.extend(make_stream(2, 20).to("cuda"))
    s = rb.sample(8)
    assert s["observation"].device.type == "cpu"
