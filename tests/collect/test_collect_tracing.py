"""A user's own network runs as its torch.fx trace in the collectors, only where that cannot change its results."""

from __future__ import annotations

import random

import pytest
import torch
from collect_helpers import MLP
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from tdrl.collect import SerialCollector
from tdrl.collect.policy import _Build, _direct_call
from tdrl.collect.tracing import traced_call
from tdrl.envs import EnvFactory


class Shifted(torch.nn.Module):
    """Argmax of an MLP, then ``(a + shift) % 2``: a Python attribute the trace freezes."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP(4, 2, discrete=True)
        self.shift = 0

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (self.mlp(obs) + self.shift) % 2


class OptionalShift(Shifted):
    """``shift`` is read with a default: deleting the attribute changes what the module computes."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = 1

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (self.mlp(obs) + getattr(self, "shift", 0)) % 2


class TrainingBranch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.lin(obs).argmax(-1) if self.training else torch.zeros_like(obs[:, 0], dtype=torch.long)


class PythonRandom(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        greedy = self.lin(obs).argmax(-1)
        return torch.randint_like(greedy, 2) if random.random() < 0.5 else greedy


class TensorCheck(PythonRandom):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if isinstance(obs, torch.Tensor):  # a trace's input is a Proxy: the trace records the other branch
            return self.lin(obs).argmax(-1)
        return torch.zeros_like(obs[:, 0], dtype=torch.long)


def _explore(values: torch.Tensor) -> torch.Tensor:
    return values.argmax(-1) if random.random() < 0.5 else values.argmin(-1)


class HelperRandom(PythonRandom):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return _explore(self.lin(obs))


class Counting(PythonRandom):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.calls = getattr(self, "calls", 0) + 1
        return self.lin(obs).argmax(-1)


class InheritedRandom(PythonRandom):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return super().forward(obs)


class DataDependent(PythonRandom):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.lin(obs)
        return out.argmax(-1) if out.sum() > 0 else out.argmin(-1)


def test_a_custom_network_runs_as_its_trace_with_current_weights():
    torch.manual_seed(0)
    module, x = MLP(4, 2, discrete=False), torch.randn(5, 4)
    traced = traced_call(module)
    assert traced is not None and torch.equal(traced(x), module(x))
    with torch.no_grad():
        module.net[0].weight.add_(1.0)  # in place, as a weight sync does
    assert torch.equal(traced(x), module(x))
    params = TensorDict.from_module(module).apply(lambda p: p.detach() * 2)
    with params.to_module(module):  # tensors swapped in, as TorchRL's functional calls do
        assert torch.equal(traced(x), module(x))
    seen = []
    with torch.nn.modules.module.register_module_forward_hook(lambda *args: seen.append(1)):
        traced(x)  # global hooks registered: the module's own call, hooks included
        assert len(seen) == 7  # MLP, Sequential and five layers


@pytest.mark.parametrize("cls", [PythonRandom, HelperRandom, InheritedRandom, Counting, DataDependent])
def test_networks_whose_trace_could_differ_keep_their_own_call(cls):
    module = cls()
    assert traced_call(module) is None
    assert _direct_call(module, _Build(trace=True)) is module
    assert not hasattr(module, "calls")  # rejected before tracing ran the forward


def test_a_trace_that_takes_another_branch_is_dropped_and_the_rest_stays_fast():
    torch.manual_seed(0)
    module = TensorCheck()
    assert traced_call(module) is not None  # traceable, but not the module's computation on tensors
    actions = {}
    for fast in (True, False):
        policy = TensorDictModule(module, ["observation"], ["action"])
        with SerialCollector(EnvFactory("CartPole-v1"), policy, batch_B=3, batch_T=16, seed=1, fast_policy=fast) as c:
            assert c.policy_step.compiled is fast  # the plan without the trace
            actions[fast] = c.collect()["action"]
    assert torch.equal(actions[True], actions[False]) and actions[True].any()


def _collect(module: torch.nn.Module, fast: bool, change) -> list[torch.Tensor]:
    policy = TensorDictModule(module, ["observation"], ["action"])
    with SerialCollector(EnvFactory("CartPole-v1"), policy, batch_B=3, batch_T=16, seed=1, fast_policy=fast) as c:
        assert c.policy_step.compiled is fast
        first = c.collect()["action"]
        change(module)
        return [first, c.collect()["action"]]


def _last_layer() -> torch.nn.Linear:
    layer = torch.nn.Linear(64, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(-1, 1, 128).reshape(2, 64))
        layer.bias.zero_()
    return layer


@pytest.mark.parametrize("case", ["attribute", "deleted", "eval", "child", "hook"])
def test_a_changed_module_rebuilds_the_plan_before_the_next_batch(case):
    """Whatever the trace could have frozen (a Python attribute, the training flag, a child module, a hook) is
    checked before every batch: the collected actions equal those of the module's own forward throughout."""
    changes = {
        "attribute": lambda m: setattr(m, "shift", 1),
        "deleted": lambda m: delattr(m, "shift"),
        "eval": lambda m: m.eval(),
        "child": lambda m: setattr(m.mlp.net, "4", _last_layer()),
        "hook": lambda m: m.mlp.net[0].register_forward_hook(lambda module, args, out: -out),
    }
    actions = {}
    for fast in (True, False):
        torch.manual_seed(0)
        module = {"eval": TrainingBranch, "deleted": OptionalShift}.get(case, Shifted)()
        actions[fast] = _collect(module, fast, changes[case])
    assert all(torch.equal(a, b) for a, b in zip(actions[True], actions[False], strict=True))


def test_module_watch_sees_plain_attributes_not_tensors_put_into_the_dict():
    """A tensor stored on a module (a cache, a tensor ``to_module`` put into the instance dict) changes nothing a
    plan froze (the plan reads tensors at call time); a new, changed or deleted plain attribute, ``eval()``, a child
    or a hook does."""
    from tdrl.collect.tracing import ModuleWatch

    module = Shifted()
    watch = ModuleWatch(module)
    module.mlp.cache = torch.zeros(3)
    assert not watch.stale()
    module.mlp.cache = torch.ones(3)
    del module.mlp.cache
    assert not watch.stale()
    for change in (lambda m: setattr(m.mlp, "scale", 2.0), lambda m: setattr(m, "shift", 1),
                   lambda m: delattr(m, "shift"), lambda m: m.eval(),
                   lambda m: m.mlp.register_forward_pre_hook(lambda *a: None),
                   lambda m: setattr(m, "extra", torch.nn.Identity())):
        module = Shifted()
        watch = ModuleWatch(module)
        change(module)
        assert watch.stale()
