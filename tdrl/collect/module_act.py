"""The tensor path for a user's TorchRL modules: a collector calls their networks on tensors, not TensorDicts.

A ``TensorDictModule``'s TensorDict bookkeeping (dispatch, key lookups, validation, writing outputs back) costs
about as much as a 2x64 MLP's forward, once per time step. So, as tdrl's own models implement ``act``
(:mod:`tdrl.models.acting`), TorchRL's module classes get an ``act`` equivalent here, from their public
attributes only: a ``TensorDictModule`` calls its ``module`` on its in_key tensors, a ``TensorDictSequential``
(``ProbabilisticActor`` included) chains its modules, and any other module (e.g. the distribution sampler of a
``ProbabilisticActor``) runs as usual on a small TensorDict of its in_keys. :class:`~tdrl.collect.PolicyStep`
takes this path only where it writes the same values as the policy's TensorDict forward on the build-time example
under both exploration types (same RNG state), so it never changes what a policy does; otherwise the policy runs
as ``policy(td)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict
from tensordict.nn import (
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from tensordict.utils import unravel_key

from tdrl.models.acting import Acting, Inputs, Outputs

__all__ = ["ActFn", "module_act"]

ActFn = Callable[[Inputs, bool], Outputs]  # (inputs, deterministic) -> the entries the module writes
SEQUENCE_FORWARDS = (TensorDictSequential.forward, ProbabilisticTensorDictSequential.forward)


def module_act(module: TensorDictModuleBase, n: int) -> ActFn | None:
    """``module``'s forward over ``n`` envs as a function of tensors (see the module docstring); ``None`` for a
    module of another class (e.g. one overriding ``forward``), which gains nothing from it."""
    act = _part_act(module, n)
    return None if act.__name__ == "td_act" else act


def _part_act(module: TensorDictModuleBase, n: int) -> ActFn:
    if isinstance(module, Acting):
        return lambda inputs, deterministic: module.act(inputs["observation"], inputs, deterministic=deterministic)
    if type(module).forward is TensorDictModule.forward and module.method is None:
        return _network_act(module)
    if isinstance(module, TensorDictSequential) and type(module).forward in SEQUENCE_FORWARDS:
        parts = module.module.values() if isinstance(module.module, torch.nn.ModuleDict) else module.module
        return _chain([_part_act(part, n) for part in parts])
    return _td_act(module, n)


def _network_act(module: TensorDictModule) -> ActFn:
    net, in_keys = module.module, [unravel_key(k) for k in module.in_keys]
    out_keys = [unravel_key(k) for k in getattr(module, "out_keys_source", module.out_keys)]

    def act(inputs: Inputs, deterministic: bool) -> Outputs:
        out = net(*[inputs[k] for k in in_keys])
        if not isinstance(out, tuple):
            out = (out,)
        return {k: v for k, v in zip(out_keys, out, strict=True) if k != "_"}

    return act


def _chain(steps: list[ActFn]) -> ActFn:
    def act(inputs: Inputs, deterministic: bool) -> Outputs:
        seen, out = dict(inputs), {}
        for step in steps:
            written = step(seen, deterministic)
            seen.update(written)
            out.update(written)
        return out

    return act


def _td_act(module: TensorDictModuleBase, n: int) -> ActFn:
    in_keys = [unravel_key(k) for k in module.in_keys]
    out_keys = [unravel_key(k) for k in module.out_keys]

    def td_act(inputs: Inputs, deterministic: bool) -> Outputs:
        result = module(TensorDict({k: inputs[k] for k in in_keys if k in inputs}, batch_size=[n]))
        return {k: result.get(k) for k in out_keys if k in result}

    return td_act
