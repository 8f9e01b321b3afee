"""Calling a policy once per time step, batched over envs.

Under RANDOM and DETERMINISTIC exploration a policy is called on tensors: through ``act`` for tdrl's own models
(:class:`tdrl.models.acting.Acting`), through :func:`tdrl.collect.module_act.module_act` for TorchRL's
``TensorDictModule``/``TensorDictSequential``/``ProbabilisticActor`` where it writes what the TensorDict forward
writes (checked at build). Any other policy, or another exploration type, runs as ``policy(td)`` on a small
TensorDict of its in_keys.

Recurrent state follows TorchRL's convention: any in_key other than the observation and ``is_init`` whose
``("next", key)`` the policy writes is kept per env, fed back every step and zeroed where ``is_init`` marks a new
episode. A policy may also read ``("collector", "env_index")``: the ``[n]`` int64 global indices of its envs
(e.g. to pick a per-env epsilon, which then also works in a worker that sees only its ``B/W`` envs), and
``prev_reward``: ``[n, 1]`` the reward of the step that led to the observation, zero where ``is_init`` (R2D1's
model input, rlpyt's ``prev_reward``); the collector stores it with the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase, set_interaction_type
from tensordict.utils import NestedKey, unravel_key

from tdrl.collect.module_act import ActFn, module_act
from tdrl.models.acting import Acting
from tdrl.utils.keys import ENV_INDEX_KEY, INIT_KEY, OBS_KEY, PREV_REWARD_KEY

__all__ = ["PolicyStep", "module_tensors"]

Env = dict[NestedKey, torch.Tensor]

ACTING_TYPES = (InteractionType.RANDOM, InteractionType.DETERMINISTIC)


def _policy_device(policy: torch.nn.Module | None) -> torch.device:
    """Device of the policy's first parameter or buffer (CPU when it has none)."""
    for tensor in module_tensors(policy) if policy is not None else []:
        return tensor.device
    return torch.device("cpu")


def module_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Parameters then buffers, in a fixed order (the same for a module and its deep copy)."""
    return [*module.parameters(), *module.buffers()]


class PolicyStep:
    """One batched policy forward per time step over ``n`` envs.

    Args:
        policy: a TorchRL ``TensorDictModuleBase`` reading ``observation`` (plus optional ``is_init``,
            ``("collector", "env_index")`` and recurrent-state keys) and writing at least ``action``.
        example: a ``[n]`` TensorDict with ``observation`` and ``is_init`` (only read, e.g. the step rows).
        exploration_type: exploration type the policy runs under; set :attr:`exploration_type` between batches.
        env_offset: global index of the first env (the ``("collector", "env_index")`` input).
        compile: call the tensor path through ``torch.compile`` (it pays for larger networks; small MLPs run
            faster without).
        obs_keys: the observation entries of ``example`` the policy may read: ``observation``, or an env with a
            dict observation's leaves (a multi-agent env's ``(group, "observation")``, ``(group, "mask")``...;
            :mod:`tdrl.collect.stepping`). With more than ``observation``, :meth:`__call__` takes a dict of them.
        action_keys: what the policy must write (``action``; a multi-agent env: ``(group, "action")`` per group).

    Attributes:
        out_template: ``[n]`` zeros TensorDict of everything the collector stores from the policy: its outputs
            and the recurrent state it read.
        acting: whether the policy is called on tensors (``act`` or :func:`~tdrl.collect.module_act.module_act`).
    """

    def __init__(self, policy: TensorDictModuleBase, example: TensorDictBase, *,
            exploration_type: InteractionType = InteractionType.RANDOM, env_offset: int = 0,
            compile: bool = False, obs_keys: Sequence[NestedKey] = (OBS_KEY,),
            action_keys: Sequence[NestedKey] = ("action",)) -> None:
        if not isinstance(policy, TensorDictModuleBase):
            raise TypeError(f"policy must be a TorchRL TensorDictModuleBase (e.g. TensorDictModule, "
                            f"ProbabilisticActor), got {type(policy).__name__}")
        self.policy = policy
        self.exploration_type = exploration_type
        self.device = _policy_device(policy)
        self.n = int(example.batch_size[0])
        # the step rows' reward, read before the envs overwrite it: the previous step's (a view, shared with workers)
        self.prev_reward = example.get(("next", "reward")) if PREV_REWARD_KEY in policy.in_keys else None
        self.obs_keys = [unravel_key(k) for k in obs_keys]
        self.obs_dict = self.obs_keys != [OBS_KEY]  # __call__ takes a dict of the observation entries
        example = example.select(*self.obs_keys, INIT_KEY).to(self.device)
        in_keys = [unravel_key(k) for k in policy.in_keys]
        out_keys = {unravel_key(k) for k in policy.out_keys}
        self.reads_init = INIT_KEY in in_keys
        self.env_index = None
        if ENV_INDEX_KEY in in_keys:
            self.env_index = torch.arange(env_offset, env_offset + self.n, device=self.device)
        provided = (*self.obs_keys, INIT_KEY, ENV_INDEX_KEY, PREV_REWARD_KEY)
        self.recurrent_keys = [k for k in in_keys if k not in provided and unravel_key(("next", k)) in out_keys]
        missing = [k for k in in_keys if k not in provided and k not in self.recurrent_keys]
        if missing:
            raise KeyError(f"policy reads {missing}, which the collector does not provide: a policy sees "
                           f"{', '.join(map(repr, self.obs_keys))}, 'is_init', ('collector', 'env_index'), "
                           "'prev_reward' and recurrent state keys K it writes back as ('next', K)")
        self.state: Env = {}
        if self.recurrent_keys:
            self.state = self._initial_state(example)
        inputs = self._inputs(self._observation(example), example[INIT_KEY])
        with torch.no_grad(), set_interaction_type(exploration_type), self._rng_untouched():
            reference = policy(self._as_td(inputs))
        self.stored_inputs = self.recurrent_keys + ([PREV_REWARD_KEY] if self.prev_reward is not None else [])
        self.out_keys = [k for k in (unravel_key(k) for k in reference.keys(True, True)) if k not in inputs]
        missing = [key for key in (unravel_key(k) for k in action_keys) if key not in self.out_keys]
        if missing:
            raise KeyError(f"policy must write {', '.join(map(repr, missing))}; it writes {self.out_keys}")
        self.out_template = TensorDict(batch_size=[self.n])
        for key in self.out_keys + self.stored_inputs:
            value = reference.get(key) if key in self.out_keys else inputs[key]
            self.out_template.set(key, torch.zeros_like(value, device="cpu"))
        act = module_act(policy, self.n)
        self.acting = act is not None and self._same_outputs(act, inputs)
        self._act: ActFn | None = (torch.compile(act) if compile else act) if act is not None and self.acting else None

    def _rng_untouched(self) -> AbstractContextManager:
        """Context of the calls that probe the policy at build: the caller's torch generators (CPU and the
        policy's device) are restored after them, so building a collector draws nothing and a resumed run may
        restore its RNG before or after building one."""
        if self.device.type == "cuda":
            return torch.random.fork_rng(devices=[self.device.index or 0], device_type="cuda")
        return torch.random.fork_rng(devices=[])

    def _same_outputs(self, act: Callable, inputs: Env) -> bool:
        """Whether ``act`` writes the TensorDict forward's outputs (same values from the same RNG state) under both
        acting exploration types. tdrl's own models promise it (:mod:`tdrl.models.acting`): a mismatch raises."""
        for kind in ACTING_TYPES:
            with torch.no_grad(), set_interaction_type(kind), self._rng_untouched():
                torch.manual_seed(0)
                written = self.policy(self._as_td(inputs))
                torch.manual_seed(0)
                try:
                    acted = act(inputs, kind is InteractionType.DETERMINISTIC)
                except Exception:
                    if isinstance(self.policy, Acting):
                        raise
                    return False
            keys = {unravel_key(k) for k in written.keys(True, True)} - set(inputs)
            same = keys <= set(acted) and (isinstance(self.policy, Acting)  # promised; may differ in the last bit
                                           or all(torch.equal(written.get(k), acted[k]) for k in keys))
            if isinstance(self.policy, Acting) and {unravel_key(k) for k in acted} != keys:
                raise TypeError(f"{type(self.policy).__name__}.act writes {sorted(map(str, acted))} but its forward "
                                f"writes {sorted(map(str, keys))} under {kind.name}")
            if not same:
                return False
        return True

    def _initial_state(self, example: TensorDictBase) -> Env:
        inputs = {**{key: example[key] for key in self.obs_keys}, INIT_KEY: torch.ones_like(example[INIT_KEY])}
        try:
            with torch.no_grad(), set_interaction_type(self.exploration_type), self._rng_untouched():
                out = self.policy(self._as_td(inputs))
        except Exception as err:
            raise RuntimeError(
                f"cannot infer the shapes of the recurrent state {self.recurrent_keys}: the policy failed "
                "when called without them (TorchRL's LSTMModule/GRUModule create zeros in that case)"
            ) from err
        return {k: torch.zeros_like(out.get(unravel_key(("next", k)))) for k in self.recurrent_keys}

    def _observation(self, td: TensorDictBase) -> torch.Tensor | Env:
        return {key: td.get(key) for key in self.obs_keys} if self.obs_dict else td.get(OBS_KEY)

    def _inputs(self, obs: torch.Tensor | Env, is_init: torch.Tensor) -> Env:
        env: Env = dict(obs) if isinstance(obs, dict) else {OBS_KEY: obs}
        if self.reads_init:
            env[INIT_KEY] = is_init
        if self.env_index is not None:
            env[ENV_INDEX_KEY] = self.env_index
        if self.prev_reward is not None:
            reward = self.prev_reward.to(self.device, non_blocking=True)
            env[PREV_REWARD_KEY] = torch.where(is_init, torch.zeros_like(reward), reward)
        env.update(self.state)
        return env

    def _as_td(self, env: Env) -> TensorDict:
        return TensorDict(env, batch_size=[self.n])

    def state_dict(self) -> dict[NestedKey, np.ndarray]:
        """The recurrent state per env (numpy copies: they cross worker pipes as plain bytes; empty for a
        feed-forward policy)."""
        return {key: value.detach().cpu().numpy().copy() for key, value in self.state.items()}

    def load_state_dict(self, state: dict[NestedKey, np.ndarray]) -> None:
        """Restore :meth:`state_dict` of a step over the same envs with the same policy architecture."""
        if set(state) != set(self.state):
            raise ValueError(f"saved recurrent state has keys {sorted(map(str, state))}, this policy "
                             f"{sorted(map(str, self.state))}")
        for key, value in state.items():
            if value.shape != self.state[key].shape:
                raise ValueError(f"saved recurrent state {key!r} has shape {tuple(value.shape)}, this policy's "
                                 f"{tuple(self.state[key].shape)}")
            self.state[key] = torch.tensor(value, dtype=self.state[key].dtype, device=self.device)

    @contextmanager
    def running(self) -> Iterator[None]:
        """Context to hold around a batch of steps: no autograd, the collector's exploration type."""
        with torch.no_grad(), set_interaction_type(self.exploration_type):
            yield

    def __call__(self, obs: torch.Tensor | Env, is_init: torch.Tensor) -> Env:
        """Run the policy for one step (inside :meth:`running`): ``obs`` ``[n, *obs_shape]`` (a dict of the
        ``obs_keys`` entries when there are several) and ``is_init`` ``[n, 1]`` (True zeroes an env's recurrent
        state); returns the outputs and the recurrent state read."""
        if is_init.device != self.device:
            obs = ({k: v.to(self.device, non_blocking=True) for k, v in obs.items()} if isinstance(obs, dict)
                   else obs.to(self.device, non_blocking=True))
            is_init = is_init.to(self.device, non_blocking=True)
        if self.recurrent_keys:
            keep = ~is_init
            for key, value in self.state.items():
                self.state[key] = value * keep.reshape(keep.shape + (1,) * (value.dim() - keep.dim()))
        inputs = self._inputs(obs, is_init)
        if self.acting and self.exploration_type in ACTING_TYPES:
            assert self._act is not None  # set with acting
            out = self._act(inputs, self.exploration_type is InteractionType.DETERMINISTIC)
        else:
            result = self.policy(self._as_td(inputs))
            out = {key: result.get(key) for key in self.out_keys}
        for key in self.stored_inputs:
            out[key] = inputs[key]
        for key in self.recurrent_keys:
            self.state[key] = out[unravel_key(("next", key))]
        return out
