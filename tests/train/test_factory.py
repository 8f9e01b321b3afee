"""``prepare_recipe``: the process-wide torch settings every recipe starts from."""

from __future__ import annotations

import os

import pytest
import torch

from tdrl.config import RecipeConfig, apply_overrides
from tdrl.wiring import prepare_recipe


@pytest.mark.parametrize("flush", [True, False])
def test_flush_denormal_follows_the_run_config(flush):
    """``run.flush_denormal`` (default true) makes the CPU treat denormal floats as zero: Adam's idle moments decay
    into that range, where arithmetic is many times slower (docs/throughput.md#phases)."""
    cfg = apply_overrides(RecipeConfig(), [f"run.flush_denormal={str(flush).lower()}"])
    try:
        prepare_recipe(cfg)
        denormal = torch.tensor([1e-39]) * 1.0
        assert (denormal.item() == 0.0) == flush
    finally:
        torch.set_flush_denormal(False)  # torch's default, for the tests after this one


def test_flush_denormal_is_the_default():
    assert RecipeConfig().run.flush_denormal is True


def test_torch_threads_stay_within_the_cores_this_process_may_use():
    """A sweep slot or SLURM task of one core: ``run.torch_threads=2`` (dqn/sac/td3's default) runs one thread, as
    two intra-op threads on one core make small updates 10-50x slower."""
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        os.sched_setaffinity(0, {min(cores)})
        prepare_recipe(apply_overrides(RecipeConfig(), ["run.torch_threads=2"]))
        assert torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
