"""Env families in one place: which ids a family covers, how it builds them, the extra it needs, and its traits,
the only env knowledge the rest of tdrl reads.

An :class:`EnvFamily` is a matcher (``env_id -> bool``), a constructor, the gymnasium registration its ids need,
the pip requirement that installs its packages (named by the one-line error when one is missing) and its
:class:`EnvTraits`: what collectors, evaluation, replay and recipes do differently for it (GameScore in TrajInfos,
frame de-duplication in replay, the ``episodic_lives`` option). :func:`family_of` picks the first family whose
matcher accepts an id: families registered with :func:`register_family` first (the newest first), then the
built-in Atari, MinAtar, tdrl POMDP, MuJoCo, PettingZoo, VMAS families and plain gymnasium, which takes every other id.

Adding a family touches ``tdrl/envs`` only: its constructor (``tdrl/envs/<family>.py``) and one
:func:`register_family` here or, for a family of one's own, at the top of the script that uses it (worker
processes import the script again, so they know it too).
"""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from tdrl.envs import atari, pomdp
from tdrl.envs.time_limit import TimeLimit
from tdrl.utils.errors import UserError

__all__ = ["EnvError", "EnvFamily", "EnvTraits", "family_of", "register_family", "traits_of"]

#: A family's constructor: ``(env_id, max_episode_steps, kwargs) -> env``; ``max_episode_steps`` ``None`` means the
#: family's own limit, ``kwargs`` are the :class:`~tdrl.envs.EnvFactory`'s.
Constructor = Callable[[str, "int | None", dict[str, Any]], gym.Env]


class EnvError(UserError):
    """An environment cannot be built; the message says why and what to install."""


@dataclass(frozen=True)
class EnvTraits:
    """What tdrl does differently for a family's envs (the defaults: nothing)."""

    frame_stack: int = 0
    """Observations stack this many image frames (Atari: 4); an off-policy replay stores each frame once
    (``tdrl.replay.FrameStack``, rlpyt's frame buffer). 0: not a frame stack."""
    game_score: bool = False
    """Rewards are a game's score: TrajInfos add ``GameScore``, the raw score whatever the algorithm clips."""
    episodic_lives: bool = False
    """The family takes the ``episodic_lives`` option: a lost life ends the RL episode, not the game."""
    batched: bool = False
    """The constructor builds one env object that steps ``num_envs`` envs together in torch (VMAS), not a
    gymnasium env: it steps with ``collector.kind=batched_env`` only (:mod:`tdrl.collect.batched_env`)."""


def make_registered(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> gym.Env:
    """``gymnasium.make`` with tdrl's :class:`TimeLimit` in place of gymnasium's (same place, same limit: the
    argument, else the registered one; -1 means none), so :func:`tdrl.envs.get_env_state` can capture it."""
    env = gym.make(env_id, max_episode_steps=-1, **kwargs)
    limit = gym.spec(env_id).max_episode_steps if max_episode_steps is None else max_episode_steps
    return env if limit is None or limit == -1 else TimeLimit(env, limit)


@dataclass(frozen=True)
class EnvFamily:
    """One env family: the ids it covers (``matches``), how it builds them (``make``) and what it needs.

    Args:
        name: shown in errors (``"Atari"``).
        matches: ``env_id -> bool``; cheap (it runs for every trait read) and importing nothing optional.
        make: the constructor, ``(env_id, max_episode_steps, kwargs) -> env`` (``None``: :func:`make_registered`,
            ``gymnasium.make`` under tdrl's time limit); observations as numpy, frames as uint8.
        register: registers the family's ids with gymnasium before a build; an ``ImportError`` there (or a
            ``gymnasium.error.DependencyNotInstalled`` from ``make``) means the extra is missing.
        extra: the pip requirement that installs the family's packages (``"tdrl[atari]"``), named by that error.
        gymnasium_ids: its ids are gymnasium ids: an unknown one fails naming the nearest registered ids. ``False``
            for a constructor that takes ids of its own.
        traits: what the rest of tdrl reads of it (:class:`EnvTraits`).
    """

    name: str
    matches: Callable[[str], bool]
    make: Constructor | None = None
    register: Callable[[], None] | None = None
    extra: str | None = None
    gymnasium_ids: bool = True
    traits: EnvTraits = field(default_factory=EnvTraits)

    def build(self, env_id: str, max_episode_steps: int | None = None, **kwargs: Any) -> gym.Env:
        """One env of this family; raises :class:`EnvError` for an unknown id or a missing extra."""
        if self.register is not None:
            try:
                self.register()
            except ImportError as e:
                raise EnvError(self._missing(env_id, f"the {e.name or 'package'} package")) from None
        if self.gymnasium_ids:
            _check_known(env_id)
        try:
            return (self.make or make_registered)(env_id, max_episode_steps, kwargs)
        except gym.error.DependencyNotInstalled as e:
            raise EnvError(self._missing(env_id, f"an extra: {e}")) from e

    def _missing(self, env_id: str, what: str) -> str:
        where = f": pip install '{self.extra}'" if self.extra else ""
        return f"environment '{env_id}' ({self.name}) needs {what}{where}"


def _check_known(env_id: str) -> None:
    if env_id not in gym.registry:
        near = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(n) for n in near)}?" if near else ""
        raise EnvError(f"unknown environment id '{env_id}'{hint}")


# --- the built-in families -------------------------------------------------------------------------------------


def _register_ale() -> None:
    import ale_py  # registers the ALE/ ids

    gym.register_envs(ale_py)


def _make_atari(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> gym.Env:
    horizon = {} if max_episode_steps is None else {"horizon": max_episode_steps}  # agent steps
    return atari.make_atari(env_id, **horizon, **kwargs)


def _make_minatar(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> gym.Env:
    return atari.make_minatar(env_id, **kwargs)


def _is_mujoco(env_id: str) -> bool:
    spec = gym.registry.get(env_id)
    if spec is None:
        return False
    entry = spec.entry_point
    where = entry if isinstance(entry, str) else getattr(entry, "__module__", "") or ""
    return "mujoco" in where


def _mujoco_warning(message: str) -> None:
    """MuJoCo's warning callback: a Python ``RuntimeWarning`` ``MuJoCo - <message>`` (no colon: a
    ``PYTHONWARNINGS`` filter cannot name a message with one, :mod:`tdrl.utils.console`). It must not raise (an
    exception crossing MuJoCo's C callback aborts the process), so where warnings are errors it prints instead."""
    try:
        warnings.warn(f"MuJoCo - {message}", RuntimeWarning, stacklevel=1)
    except Exception:
        try:
            print(f"MuJoCo warning: {message}", file=sys.stderr)
        except Exception:  # no usable stderr (interpreter shutdown): drop the message rather than abort
            pass


def _route_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to Python's ``warnings`` (shown once, filterable) instead of stderr plus a
    ``MUJOCO_LOG.TXT`` in the working directory once per env built. Keeps a handler installed before."""
    try:
        import mujoco
    except ImportError:  # gymnasium.make then raises DependencyNotInstalled, with the pip hint
        return
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


def _make_mujoco(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> gym.Env:
    _route_mujoco_warnings()
    return make_registered(env_id, max_episode_steps, kwargs)


def _make_vmas(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> Any:
    from tdrl.envs.vmas import make_vmas  # imports VMAS and TorchRL's wrapper only when used

    return make_vmas(env_id, max_episode_steps, kwargs)


def _make_multiagent(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> gym.Env:
    from tdrl.envs.marl import make_multiagent  # imports PettingZoo's packages only when used

    return make_multiagent(env_id, max_episode_steps, kwargs)


_BUILT_IN = (
    # Atari (``ALE/Pong-v5``, ``PongNoFrameskip-v4``): rlpyt's preprocessing and options (tdrl.envs.atari)
    EnvFamily("Atari", lambda env_id: env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"), _make_atari,
              _register_ale, "tdrl[atari]", traits=EnvTraits(frame_stack=4, game_score=True, episodic_lives=True)),
    # MinAtar (``MinAtar/Breakout-v1``): 10x10 uint8 images, one frame each
    EnvFamily("MinAtar", lambda env_id: env_id.startswith("MinAtar/"), _make_minatar, atari.register_minatar,
              "tdrl[minatar]"),
    # tdrl's own ids (``tdrl/CartPoleNoVelocity-v1``, tdrl.envs.pomdp)
    EnvFamily("tdrl", lambda env_id: env_id.startswith("tdrl/"), register=pomdp.register_pomdps),
    # gymnasium's MuJoCo envs (``HalfCheetah-v5``): MuJoCo's warnings routed to Python's
    EnvFamily("MuJoCo", _is_mujoco, _make_mujoco, extra="gymnasium[mujoco]"),
    # multi-agent (``mpe2/simple_spread_v3``, ``pettingzoo/<family>/<env>``, ``lbforaging/<id>``): PettingZoo parallel
    # envs over fixed agent groups, TorchRL's grouped keys (tdrl.envs.marl, tdrl.envs.multiagent)
    EnvFamily("PettingZoo", lambda env_id: env_id.startswith(("mpe2/", "pettingzoo/", "lbforaging/")),
              _make_multiagent, extra="tdrl[marl]", gymnasium_ids=False),
    # VMAS scenarios (``vmas/balance``): one batched torch env of num_envs envs (tdrl.envs.vmas), TorchRL's grouped keys
    EnvFamily("VMAS", lambda env_id: env_id.startswith("vmas/"), _make_vmas, extra="tdrl[marl]", gymnasium_ids=False,
              traits=EnvTraits(batched=True)),
    # everything else gymnasium has registered (classic control, Box2D, a user's gym.register)
    EnvFamily("gymnasium", lambda env_id: True),
)
_REGISTERED: list[EnvFamily] = []


def register_family(family: EnvFamily) -> None:
    """Add ``family`` (or replace the one of the same name) ahead of those registered before it and of the built-in
    ones, so it takes the ids it matches."""
    _REGISTERED[:] = [family] + [f for f in _REGISTERED if f.name != family.name]


def family_of(env_id: str) -> EnvFamily:
    """The family of ``env_id``: the first whose matcher accepts it (registered families, then the built-in ones;
    plain gymnasium takes every id)."""
    return next(family for family in (*_REGISTERED, *_BUILT_IN) if family.matches(env_id))


def traits_of(env_factory: Any) -> EnvTraits:
    """The traits of the envs ``env_factory`` builds: its ``traits`` attribute (an :class:`~tdrl.envs.EnvFactory`:
    its family's); the defaults for a factory without one (a user's own callable)."""
    traits = getattr(env_factory, "traits", None)
    return traits if isinstance(traits, EnvTraits) else EnvTraits()
