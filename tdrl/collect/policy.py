"""Calling a TorchRL policy once per time step, batched over envs, with as little overhead as possible.

A ``TensorDictModule`` call costs 35-70 µs of generic TensorDict machinery on this CPU (tensordict 0.14.3 even
runs ``importlib.util.find_spec("pandas")`` on every output write), more than the 2×64 MLP it wraps. In a
collector that is paid every step, so :class:`PolicyStep` *compiles* the policy tree once:

* a plain ``TensorDictModule`` (incl. ``ValueOperator``, ``Actor``, ``SafeModule``) becomes a direct call of its
  ``nn.Module`` on tensors taken from a dict, and that module's layers are called directly too: ``nn.Sequential``
  chains layer by layer, a user's own network through its ``torch.fx`` trace where that is safe
  (:mod:`tdrl.collect.tracing`);
* ``TensorDictSequential`` (incl. ``ProbabilisticActor``, ``QValueActor``, ``ActorValueOperator`` parts) becomes
  the sequence of its compiled children;
* the distribution heads PPO/A2C/SAC use most — ``Categorical`` over ``logits``, TorchRL's ``IndependentNormal``
  over ``loc``/``scale`` and its ``TanhNormal`` (sampling only) — sample and score directly with torch ops when
  the exploration type is RANDOM (the same ops, in the same order, as ``torch.distributions`` and TorchRL);
* the action heads of the Q-learning recipes — TorchRL's ``QValueModule`` (categorical actions), tdrl's
  ``EpsilonGreedy`` and TorchRL's ``AdditiveGaussianModule`` — run their tensor-level step directly;
* anything else (other distribution heads or exploration types, ``EGreedyModule``, ``LSTMModule``...) runs as-is on
  a minimal TensorDict holding only its ``in_keys``.

The compiled plan is checked against the policy's own forward on an example input, under the same RNG seed, in
both RANDOM and DETERMINISTIC exploration; any difference in keys or values makes :class:`PolicyStep` fall back
to calling the policy itself (``fast=False`` forces that). Before every batch the plan is rebuilt (and checked
again) if a module it calls directly has changed since: a plain attribute, ``train()``/``eval()``, a child module
or a hook. So the fast path is an optimisation, never a change of semantics.

Recurrent policies follow TorchRL's convention: the policy reads ``("recurrent_state", "h")``-style keys and
writes ``("next", "recurrent_state", "h")``. Any policy ``in_key`` that is neither the observation nor
``is_init`` and whose ``("next", key)`` the policy writes is treated as recurrent state: :class:`PolicyStep`
keeps it per env, feeds it back every step and zeroes an env's state when ``is_init`` marks the first step of a
new episode.

A policy may also read ``("collector", "env_index")``: the ``[n]`` int64 global indices of the envs it acts for
(e.g. to pick each env's epsilon from a per-env vector, as rlpyt's vector epsilon-greedy does, which then also
works when a worker's policy copy sees only its ``B/W`` envs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
    set_interaction_type,
)
from tensordict.nn.probabilistic import interaction_type
from tensordict.utils import NestedKey, unravel_key
from torchrl.data import Bounded  # loaded with tdrl.envs anyway

from tdrl.collect.tracing import (
    ACTIVATIONS,
    ModuleWatch,
    chain,
    global_hooks,
    hooked,
    layer_function,
    traced_call,
)

__all__ = ["PolicyStep", "module_tensors", "policy_device"]

Env = dict[NestedKey, torch.Tensor]
Plan = Callable[[Env], None]

OBS_KEY = "observation"
INIT_KEY = "is_init"
ENV_INDEX_KEY = ("collector", "env_index")


def policy_device(policy: torch.nn.Module | None) -> torch.device:
    """Device of the policy's first parameter or buffer (CPU when it has none)."""
    if policy is not None:
        for tensor in policy.parameters():
            return tensor.device
        for tensor in policy.buffers():
            return tensor.device
    return torch.device("cpu")


def module_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Parameters then buffers, in a fixed order (the same for a module and its deep copy)."""
    return [*module.parameters(), *module.buffers()]


def _keys(keys: Any) -> list[NestedKey]:
    return [unravel_key(k) for k in keys]


@dataclass
class _Build:
    """One compilation of a policy: whether users' networks may run as their traces (and whether one did), and the
    networks made direct calls (the plan is rebuilt when one of them is stale)."""

    trace: bool
    traced: bool = False
    watches: list[ModuleWatch] = field(default_factory=list)


def _direct_call(module: torch.nn.Module, build: _Build) -> Callable[..., Any]:
    """``module`` as a plain function, skipping ``nn.Module.__call__`` (about 2 µs per layer, as much as a 64-wide
    layer itself costs): an ``nn.Sequential`` chain (subclasses that keep its ``forward``, and TorchRL's ``MLP`` with
    one input) runs its children in turn, ``Linear`` layers and elementwise activations as functions
    (:func:`~tdrl.collect.tracing.layer_function`); another network of the user's runs as its ``torch.fx`` trace
    where that is safe (:func:`~tdrl.collect.tracing.traced_call`); a module with hooks, or anything else, is
    called as usual."""
    if hooked(module):
        return module
    if not chain(module):
        traced = traced_call(module) if build.trace else None
        build.traced |= traced is not None
        return module if traced is None else traced
    steps = [
        layer_function(child) if type(child) is torch.nn.Linear or type(child) in ACTIVATIONS
        else _direct_call(child, build)
        for child in module
    ]

    def run(*inputs: torch.Tensor) -> Any:
        if len(inputs) != 1 or global_hooks():
            return module(*inputs)
        x = inputs[0]
        for step in steps:
            x = step(x)
        return x

    return run


def _leaf_plan(module: TensorDictModule, build: _Build) -> Plan:
    inner = _direct_call(module.module, build)
    if inner is not module.module:  # one watch over the whole network covers its direct-called parts
        build.watches.append(ModuleWatch(module.module))
    in_keys = _keys(module.in_keys)
    out_keys = _keys(module.out_keys)

    def run(env: Env) -> None:
        result = inner(*[env[k] for k in in_keys])
        if not isinstance(result, tuple):
            result = (result,)
        for key, value in zip(out_keys, result, strict=True):
            if key != "_":
                env[key] = value

    return run


def _opaque_plan(module: TensorDictModuleBase, batch_size: torch.Size) -> Plan:
    in_keys = _keys(module.in_keys)
    out_keys = _keys(module.out_keys)

    def run(env: Env) -> None:
        td = TensorDict(batch_size=batch_size)
        for key in in_keys:
            value = env.get(key)
            if value is not None:
                td.set(key, value)
        out = module(td)
        for key in out_keys:
            value = out.get(key, None)
            if value is not None:
                env[key] = value

    return run


def _sample_categorical(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Categorical(logits=...)``: ``sample()`` then ``log_prob``.

    The normalised logits and probabilities are torch.distributions' own ops. The draw is what
    ``torch.multinomial(probs, 1)`` computes for one sample (an exponential race: ``argmax(probs / q)``,
    ``q ~ Exp(1)`` from the same generator, hence the same actions), without its ~14 µs of argument checks; the
    one check that can fail here (NaN or +inf logits) is kept.
    """
    lse = logits.logsumexp(dim=-1, keepdim=True)
    if not math.isfinite(lse.sum().item()):  # one reduction: isfinite().all() costs ~6 ops
        raise ValueError("the policy's logits hold NaN or +inf (or all -inf): no categorical distribution")
    norm = logits - lse
    probs = torch.softmax(norm, dim=-1)
    action = (probs / torch.empty_like(probs).exponential_(1)).argmax(-1)
    return action, norm.gather(-1, action.unsqueeze(-1)).squeeze(-1)


def _sample_independent_normal(loc: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TorchRL ``IndependentNormal(loc, scale)``: ``rsample()`` then ``log_prob`` summed over the last dim."""
    loc, scale = torch.broadcast_tensors(loc, scale)
    action = loc + torch.empty_like(loc).normal_() * scale
    log_prob = -((action - loc) ** 2) / (2 * scale**2) - scale.log() - math.log(math.sqrt(2 * math.pi))
    return action, log_prob.sum(-1)


def _tanh_normal_sampler(kwargs: dict[str, Any]) -> Callable[..., tuple[torch.Tensor, None]] | None:
    """TorchRL ``TanhNormal(loc, scale, low=..., high=...)`` ``rsample()`` (SAC's policy), for its default
    ``tanh_loc=False, safe_tanh=True``: tanh of a Normal sample clamped to ``1 - resolution``, then the affine map onto
    ``[low, high]`` when that is not ``[-1, 1]``; ``None`` for other arguments."""
    if set(kwargs) - {"low", "high"}:
        return None
    low = torch.as_tensor(kwargs.get("low", -1.0), dtype=torch.get_default_dtype())
    high = torch.as_tensor(kwargs.get("high", 1.0), dtype=torch.get_default_dtype())
    affine = bool((low != -1.0).any() or (high != 1.0).any())
    mid, half = (high + low) / 2, (high - low) / 2

    def sample(loc: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, None]:
        preimage = loc + torch.empty_like(loc).normal_() * scale
        lim = 1.0 - torch.finfo(preimage.dtype).resolution
        action = preimage.tanh().clamp(-lim, lim)
        return (mid.to(action.device) + half.to(action.device) * action if affine else action), None

    return sample


def _probabilistic_plan(module: TensorDictModuleBase, batch_size: torch.Size) -> Plan | None:
    """Direct sampling for Categorical / IndependentNormal / TanhNormal heads in RANDOM mode; other modes run the
    module."""
    from torch.distributions import Categorical
    from torchrl.modules import IndependentNormal, TanhNormal
    from torchrl.modules.tensordict_module.probabilistic import SafeProbabilisticModule

    if type(module) not in (ProbabilisticTensorDictModule, SafeProbabilisticModule):
        return None
    tanh_normal = module.distribution_class is TanhNormal and not module.return_log_prob
    if (
        (module.distribution_kwargs and not tanh_normal)
        or module.num_samples is not None
        or getattr(module, "_generator", None) is not None
        or getattr(module, "_generator_key", None) is not None
        or getattr(module, "safe", False)
        or len(module.dist_sample_keys) != 1
    ):
        return None
    dist_keys = [k[-1] if isinstance(k, tuple) else k for k in module.dist_keys]
    if module.distribution_class is Categorical and dist_keys == ["logits"]:
        sampler = _sample_categorical
    elif module.distribution_class is IndependentNormal and dist_keys in (["loc", "scale"], ["scale", "loc"]):
        sampler = _sample_independent_normal
    elif tanh_normal and sorted(dist_keys) == ["loc", "scale"]:
        sampler = _tanh_normal_sampler(dict(module.distribution_kwargs))
        if sampler is None:
            return None
    else:
        return None
    in_keys = dict(zip(dist_keys, _keys(module.in_keys), strict=True))
    args = [in_keys[k] for k in (["logits"] if sampler is _sample_categorical else ["loc", "scale"])]
    sample_key = unravel_key(module.dist_sample_keys[0])
    log_prob_key = unravel_key(module.log_prob_key) if module.return_log_prob else None
    default = module.default_interaction_type
    fallback = _opaque_plan(module, batch_size)

    def run(env: Env) -> None:
        if (interaction_type() or default) is not InteractionType.RANDOM:
            fallback(env)
            return
        action, log_prob = sampler(*[env[k] for k in args])
        env[sample_key] = action
        if log_prob_key is not None:
            env[log_prob_key] = log_prob

    return run


def _action_head_plan(module: TensorDictModuleBase) -> Plan | None:
    """Direct tensor steps for the action heads of the Q-learning recipes, which otherwise cost a TensorDict
    round trip per step (~40-80 µs, more than a small Q-network): TorchRL's ``QValueModule`` over categorical
    actions without a mask (argmax, then the chosen value), tdrl's ``EpsilonGreedy`` (its own
    :meth:`~tdrl.models.exploration.EpsilonGreedy.explore`) and TorchRL's ``AdditiveGaussianModule`` (its own
    noise-and-project step, under RANDOM exploration only, as its ``forward``; see :func:`_add_gaussian_noise`)."""
    from torchrl.envs.utils import ExplorationType, exploration_type
    from torchrl.modules import AdditiveGaussianModule, QValueModule

    from tdrl.models.exploration import EpsilonGreedy

    cls = type(module)
    if cls is QValueModule and module.action_space == "categorical" and module.action_mask_key is None:
        (value_key,), (action_key, value_out, chosen_key) = _keys(module.in_keys), _keys(module.out_keys)

        def greedy(env: Env) -> None:
            values = env[value_key]
            action = torch.argmax(values, dim=-1)
            env[action_key], env[value_out] = action, values
            env[chosen_key] = values.gather(-1, action.unsqueeze(-1))

        return greedy
    if cls is EpsilonGreedy:
        key = unravel_key(module.action_key)

        def epsilon_greedy(env: Env) -> None:
            env[key] = module.explore(env[key])

        return epsilon_greedy
    if cls is AdditiveGaussianModule and callable(getattr(module, "_add_noise", None)):
        key = unravel_key(module.action_key)

        def gaussian_noise(env: Env) -> None:
            if exploration_type() in (ExplorationType.RANDOM, None):
                env[key] = _add_gaussian_noise(module, env[key])

        return gaussian_noise
    return None


def _add_gaussian_noise(module: Any, action: torch.Tensor) -> torch.Tensor:
    """``AdditiveGaussianModule._add_noise`` with its draws and values, at about half its cost (122-138 -> 63-76 µs).

    ``torch.normal(mean, std)`` is N(0, 1) draws scaled in place (``normal_`` then ``mul_(std).add_(mean)``, as ATen
    computes it) behind a per-call argument check that costs more than the draw; the projection onto a ``Bounded``
    box returns in-box values unchanged and clamps the others, so a clamp gives the same values. Anything else (another
    spec, integer mean/std, another device) takes the module's own step.
    """
    spec = module._spec[module.action_key] if module._spec is not None else None
    mean, std, sigma = module._buffers["mean"], module._buffers["std"], module._buffers["sigma"]
    if not (isinstance(spec, Bounded) and spec.domain == "continuous" and mean.dtype.is_floating_point
            and std.dtype.is_floating_point and mean.device == std.device == action.device
            and action.device.type == "cpu"):
        return module._add_noise(action)
    if std.numel() and bool(std.min() < 0):
        raise RuntimeError("normal expects all elements of std >= 0.0")
    noise = torch.empty(action.shape, dtype=mean.dtype).normal_(0, 1).mul_(std).add_(mean)
    noisy = action + noise * sigma
    return torch.clamp(noisy, spec.space.low.expand_as(noisy), spec.space.high.expand_as(noisy))


def _compile(module: TensorDictModuleBase, batch_size: torch.Size, build: _Build) -> Plan:
    """Turn a policy tree into a function over a dict of tensors (see the module docstring)."""
    cls = type(module)
    if (
        isinstance(module, TensorDictModule)
        and not isinstance(module, TensorDictSequential)
        and cls.forward is TensorDictModule.forward
        and isinstance(module.module, torch.nn.Module)
        and not isinstance(module.module, TensorDictModuleBase)
        and module._kwargs is None
        and module.method is None
        and not module.method_kwargs
    ):
        return _leaf_plan(module, build)
    if (
        isinstance(module, TensorDictSequential)
        and cls.forward in (TensorDictSequential.forward, ProbabilisticTensorDictSequential.forward)
        and not module._select_before_return
        and not module.partial_tolerant
    ):
        children = [_compile(child, batch_size, build) for child in module._module_iter()]

        def run(env: Env) -> None:
            for child in children:
                child(env)

        return run
    return _action_head_plan(module) or _probabilistic_plan(module, batch_size) or _opaque_plan(module, batch_size)


class PolicyStep:
    """One batched policy forward per time step over ``n`` envs.

    Args:
        policy: a TorchRL ``TensorDictModuleBase`` reading ``observation`` (plus optional ``is_init`` and
            recurrent-state keys) and writing at least ``action``.
        example: a ``[n]`` TensorDict with ``observation`` and ``is_init`` (real reset observations are best).
        exploration_type: TorchRL exploration type the policy runs under (RANDOM for training, DETERMINISTIC
            for evaluation); can be changed between batches via :attr:`exploration_type`.
        fast: allow the compiled fast path (checked against the policy's own forward).
        env_offset: global index of the first env (``("collector", "env_index")`` input).

    Attributes:
        out_template: ``[n]`` TensorDict of everything the collector stores from the policy: its outputs and the
            recurrent state it read (zeros), with shapes and dtypes.
        recurrent_keys: recurrent-state input keys (each has ``("next", key)`` among the outputs).
        compiled: whether the fast path is in use.
    """

    def __init__(
        self,
        policy: TensorDictModuleBase,
        example: TensorDictBase,
        *,
        exploration_type: InteractionType = InteractionType.RANDOM,
        fast: bool = True,
        env_offset: int = 0,
    ) -> None:
        if not isinstance(policy, TensorDictModuleBase):
            raise TypeError(
                f"policy must be a TorchRL TensorDictModuleBase (e.g. TensorDictModule, ProbabilisticActor), "
                f"got {type(policy).__name__}"
            )
        self.policy = policy
        self.exploration_type = exploration_type
        self.device = policy_device(policy)
        self.n = int(example.batch_size[0])
        self.batch_size = torch.Size([self.n])
        example = example.to(self.device)
        in_keys = _keys(policy.in_keys)
        out_keys = set(_keys(policy.out_keys))
        self.reads_init = INIT_KEY in in_keys
        self.env_index = (
            torch.arange(env_offset, env_offset + self.n, device=self.device) if ENV_INDEX_KEY in in_keys else None
        )
        provided = (OBS_KEY, INIT_KEY, ENV_INDEX_KEY)
        self.recurrent_keys: list[NestedKey] = [
            k for k in in_keys if k not in provided and unravel_key(("next", k)) in out_keys
        ]
        missing = [k for k in in_keys if k not in provided and k not in self.recurrent_keys]
        if missing:
            raise KeyError(
                f"policy reads {missing}, which the collector does not provide: a policy sees 'observation', "
                "'is_init', ('collector', 'env_index') and recurrent state keys K it writes back as ('next', K)"
            )
        self.state = self._initial_state(example)
        inputs = self._inputs(example[OBS_KEY], example[INIT_KEY])
        with torch.no_grad(), set_interaction_type(exploration_type):
            reference = policy(self._as_td(inputs))
        self.out_keys: list[NestedKey] = [k for k in _keys(reference.keys(True, True)) if k not in inputs]
        if "action" not in self.out_keys:
            raise KeyError(f"policy must write 'action'; it writes {self.out_keys}")
        template = TensorDict(batch_size=self.batch_size)
        for key in self.out_keys + self.recurrent_keys:
            value = reference.get(key) if key in self.out_keys else self.state[key]
            template.set(key, torch.zeros_like(value, device="cpu"))
        self.out_template = template
        self._example = example
        self._plan: Plan | None = None
        self._watches: list[ModuleWatch] = []
        if fast:
            self._build_plan()

    @property
    def compiled(self) -> bool:
        return self._plan is not None

    def _build_plan(self) -> None:
        """Compile the policy and keep the plan only if it reproduces the policy's forward; if a plan with traced
        networks does not, try once more without tracing (a trace can take another branch than the real inputs,
        e.g. on ``isinstance(x, torch.Tensor)``)."""
        for trace in (True, False):
            build = _Build(trace)
            self._plan = _compile(self.policy, self.batch_size, build)
            if self._plan_matches(self._example):
                self._watches = build.watches
                return
            if not build.traced:
                break
        self._plan, self._watches = None, []

    def _initial_state(self, example: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        if not self.recurrent_keys:
            return {}
        inputs = {OBS_KEY: example[OBS_KEY], INIT_KEY: torch.ones_like(example[INIT_KEY])}
        try:
            with torch.no_grad(), set_interaction_type(self.exploration_type):
                out = self.policy(self._as_td(inputs))
        except Exception as err:
            raise RuntimeError(
                f"cannot infer the shapes of the recurrent state {self.recurrent_keys}: the policy failed "
                "when called without them (TorchRL's LSTMModule/GRUModule create zeros in that case)"
            ) from err
        return {k: torch.zeros_like(out.get(unravel_key(("next", k)))) for k in self.recurrent_keys}

    def _inputs(self, obs: torch.Tensor, is_init: torch.Tensor) -> Env:
        env: Env = {OBS_KEY: obs}
        if self.reads_init:
            env[INIT_KEY] = is_init
        if self.env_index is not None:
            env[ENV_INDEX_KEY] = self.env_index
        for key, value in self.state.items():
            env[key] = value
        return env

    def _as_td(self, env: Env) -> TensorDict:
        td = TensorDict(batch_size=self.batch_size, device=None)
        for key, value in env.items():
            td.set(key, value)
        return td

    def _plan_matches(self, example: TensorDictBase) -> bool:
        assert self._plan is not None
        for kind in (InteractionType.RANDOM, InteractionType.DETERMINISTIC):
            inputs = self._inputs(example[OBS_KEY], example[INIT_KEY])
            with torch.no_grad(), set_interaction_type(kind), torch.random.fork_rng(devices=[]):
                torch.manual_seed(12345)
                reference = self.policy(self._as_td(dict(inputs)))
                torch.manual_seed(12345)
                env = dict(inputs)
                try:
                    self._plan(env)
                except Exception:
                    return False
            for key in self.out_keys:
                if key not in env or not torch.equal(env[key], reference.get(key)):
                    return False
        return True

    @contextmanager
    def running(self) -> Iterator[None]:
        """Context to hold around a batch of steps: no autograd, the collector's exploration type; first rebuilds
        the plan if a module it calls directly has changed (a flag, ``train()``/``eval()``, a child, a hook)."""
        if any(watch.stale() for watch in self._watches):
            self._build_plan()
        with torch.no_grad(), set_interaction_type(self.exploration_type):
            yield

    def __call__(self, obs: torch.Tensor, is_init: torch.Tensor) -> Env:
        """Run the policy for one step (call inside :meth:`running`).

        Args:
            obs: ``[n, *obs_shape]`` observations (any device; moved to the policy's).
            is_init: ``[n, 1]`` bool, True where the observation starts an episode (zeroes recurrent state).

        Returns:
            dict of the policy outputs (``out_keys``) and the recurrent state it read, on the policy's device.
        """
        device = self.device
        if obs.device != device:
            obs = obs.to(device, non_blocking=True)
            is_init = is_init.to(device, non_blocking=True)
        if self.recurrent_keys:
            keep = ~is_init
            for key, value in self.state.items():
                self.state[key] = value * keep.reshape(keep.shape + (1,) * (value.dim() - keep.dim()))
        env = self._inputs(obs, is_init)
        if self._plan is not None:
            self._plan(env)
            out = env
        else:
            result = self.policy(self._as_td(env))
            out = {key: result.get(key) for key in self.out_keys}
            out.update({key: env[key] for key in self.recurrent_keys})
        for key in self.recurrent_keys:
            self.state[key] = out[unravel_key(("next", key))]
        return out

    def reset_state(self) -> None:
        """Zero the recurrent state of every env (e.g. when envs are re-seeded)."""
        for key, value in self.state.items():
            self.state[key] = torch.zeros_like(value)
