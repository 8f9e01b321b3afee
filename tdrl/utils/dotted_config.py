"""Typed dataclass configs with dotted ``key=value`` overrides, ``--help`` from the fields' docstrings, and the
one-line ending of bad input. Generic: nothing here knows tdrl's sections (those are :mod:`tdrl.config`).

Unknown keys, wrong types and values out of a field's declared range (``Annotated[float, Range(gt=0)]``) are errors
that name the full dotted key (an unknown one with the nearest valid key). A section may define ``validate(self)``
raising :class:`ConfigError` for values that cannot work together; :func:`apply_overrides` calls it after every
override is in. ``--help`` lists every field with its type and range, default and the string literal under it.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import difflib
import inspect
import json
import os
import sys
import textwrap
import types
import typing
from typing import Annotated, Any, Literal, TypeVar

from tdrl.utils.console import quiet_console
from tdrl.utils.errors import NothingToDo, UserError
from tdrl.utils.interrupt import interrupts_end_in_one_line
from tdrl.utils.ranges import Length, Range

__all__ = ["ConfigError", "apply_overrides", "config_help", "diff_configs", "flatten", "merge_nested", "parse_args",
           "run_recipe", "to_dict", "user_errors", "validate"]

C = TypeVar("C")


class ConfigError(UserError):
    """A config key or value is invalid; the message names the dotted key."""


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict (JSON-serialisable) of a dataclass config."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def flatten(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for key, value in nested.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def merge_nested(cfg: C, nested: dict[str, Any]) -> C:
    """A copy of ``cfg`` with a nested dict's values merged in, strictly as :func:`apply_overrides` (rlpyt's
    ``update_config``)."""
    return apply_overrides(cfg, flatten(nested))


def diff_configs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two nested config dicts: ``{key: (a_value, b_value)}``."""
    fa, fb = flatten(a), flatten(b)
    missing = object()
    pairs = {k: (fa.get(k, missing), fb.get(k, missing)) for k in sorted(set(fa) | set(fb))}
    return {k: (va, vb) for k, (va, vb) in pairs.items() if va != vb}


# --- Overrides -------------------------------------------------------------------------------------------


def _fields(cls: type) -> dict[str, Any]:
    """Field name -> resolved type hint (with its ``Annotated`` range)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _all_keys(cfg: Any, prefix: str = "") -> list[str]:
    keys = []
    for name in _fields(type(cfg)):
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            keys.extend(_all_keys(value, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _unknown_key(key: str, cfg: Any) -> ConfigError:
    valid = _all_keys(cfg)
    near = [k for k in valid if k.lower() == key.lower()]  # batch_b -> batch_B, before any fuzzy match
    near = near or difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if not near:  # try matching the last component only, e.g. 'lrr' -> 'optim.lr'
        tails = {k.rsplit(".", 1)[-1]: k for k in valid}
        hit = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(tails), n=1, cutoff=0.6)
        near = [tails[hit[0]]] if hit else []
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return ConfigError(f"unknown config key '{key}'{hint} (see --help for all keys)")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert ``value`` (a CLI string or a python value) to type ``tp`` and check its declared range, or raise
    naming ``key`` (a list's item as ``key[i]``)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is Annotated:
        return _coerce_annotated(key, value, args[0], args[1:])
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(key, value, tp)
    if origin is Literal:
        return _coerce_literal(key, value, args)
    if origin in (list, tuple):
        item_tp = args[0] if args else Any
        items = _list_items(key, value, nested=_is_list_type(item_tp))
        out = [_coerce(f"{key}[{i}]", item, item_tp) for i, item in enumerate(items)]
        return tuple(out) if origin is tuple else out
    if tp is bool:
        return _coerce_bool(key, value)
    if tp in (int, float):
        return _coerce_number(key, value, tp)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"config key '{key}': unsupported field type {tp}")


def _coerce_annotated(key: str, value: Any, tp: Any, metadata: tuple[Any, ...]) -> Any:
    """``Annotated[tp, ...]``: ``value`` as ``tp``, within each :class:`Range` or :class:`Length` of ``metadata``."""
    out = _coerce(key, value, tp)
    for bound in metadata:
        if isinstance(bound, (Range, Length)) and (problem := bound.violation(out)) is not None:
            raise ConfigError(f"config key '{key}': {problem}")
    return out


def _coerce_union(key: str, value: Any, tp: Any) -> Any:
    """``A | B | None``: ``None`` for ``none``/``null`` where the union has it, else the first arm that fits."""
    args = typing.get_args(tp)
    is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
    if is_none and type(None) in args:
        return None
    arms = [arg for arg in args if arg is not type(None)]
    if len(arms) == 1:  # its own error says what is wrong (the type or the range)
        return _coerce(key, value, arms[0])
    for arg in arms:
        with contextlib.suppress(ConfigError):
            return _coerce(key, value, arg)
    raise ConfigError(f"config key '{key}': {value!r} does not fit {_type_name(tp)}")


def _coerce_literal(key: str, value: Any, choices: tuple[Any, ...]) -> Any:
    """The choice ``value`` is, or names (a CLI string)."""
    for choice in choices:
        if value == choice or (isinstance(value, str) and str(choice) == value):
            return choice
    raise ConfigError(f"config key '{key}': {value!r} is not one of {list(choices)}")


def _coerce_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"config key '{key}': expected a bool (true/false), got {value!r}")


def _coerce_number(key: str, value: Any, tp: type[int] | type[float]) -> int | float:
    """An int or a float (``tp``) from a number or a string (``1e6``, ``1_000_000``); never from a bool, and an int
    only from an integral value."""
    if not isinstance(value, bool):
        if tp is int and isinstance(value, int):
            return value
        with contextlib.suppress(TypeError, ValueError):  # strings accept 1e6 and 1_000_000
            number = float(value.replace("_", "") if isinstance(value, str) else value)
            if tp is float or number.is_integer():
                return tp(number)
    raise ConfigError(f"config key '{key}': expected {'an int' if tp is int else 'a float'}, got {value!r}")


def _is_list_type(tp: Any) -> bool:
    """Whether ``tp`` (possibly ``Annotated``) is a list or tuple type: a list of them parses nested brackets."""
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return typing.get_origin(tp) in (list, tuple)


def _list_items(key: str, value: Any, nested: bool = False) -> list[Any]:
    """The items of a list value: a python list or tuple, or a string ``[a, b]``, ``(a, b)`` or ``a, b`` with
    balanced brackets and no empty item (``[]`` is the empty list), so a typo cannot drop an item silently.
    ``nested``: the items are lists themselves, each in brackets (``[[0, 1], [1, 2]]``)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if not isinstance(value, str):
        raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
    text = value.strip()
    if text[:1] in ("[", "(") and text[-1:] == {"[": "]", "(": ")"}[text[0]]:
        text = text[1:-1].strip()
        if not text:
            return []
    items = _split_nested(text) if nested else [item.strip() for item in text.split(",")]
    if items is None or any(not item or (not nested and any(c in item for c in "[]()")) for item in items):
        example = "[[0, 1], [1, 2]]" if nested else "[64, 64]"
        raise ConfigError(f"config key '{key}': {value!r} is not a list; write it as {example} (balanced brackets, "
                          "no empty item; [] is the empty list)")
    return items


def _split_nested(text: str) -> list[str] | None:
    """``[0, 1], [1, 2]`` -> ``["[0, 1]", "[1, 2]"]``: split at the commas outside brackets; each item must be one
    bracketed list. None where the brackets do not balance or an item is not in brackets."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text + ","):
        depth += (c in "[(") - (c in "])")
        if depth < 0:
            return None
        if c == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    if depth or any(item[:1] not in ("[", "(") or item[-1:] not in ("]", ")") for item in items):
        return None
    return items


def apply_overrides(cfg: C, overrides: dict[str, Any] | list[str]) -> C:
    """A copy of ``cfg`` with dotted overrides, ``{"optim.lr": 3e-4}`` or ``["optim.lr=3e-4"]``, applied (strings
    are converted to the field's type).

    Raises:
        ConfigError: unknown key (with the nearest valid key) or a value that does not fit the field's type.
    """
    if isinstance(overrides, list):
        if bad := [item for item in overrides if "=" not in item]:
            raise ConfigError(f"override {bad[0]!r} is not of the form key=value")
        overrides = {key.strip(): value for key, value in (item.split("=", 1) for item in overrides)}
    out = copy.deepcopy(cfg)
    for key, value in overrides.items():
        node: Any = out
        parts = key.split(".")
        for i, part in enumerate(parts):
            fields = _fields(type(node))
            if part not in fields:
                raise _unknown_key(key, cfg)
            tp = fields[part]
            current = getattr(node, part)
            if i < len(parts) - 1:
                if not dataclasses.is_dataclass(current):
                    raise _unknown_key(key, cfg)
                node = current
            elif dataclasses.is_dataclass(current):
                if not isinstance(value, dict):
                    raise ConfigError(f"config key '{key}' is a section; set its fields ({key}.<field>=...)")
                setattr(node, part, merge_nested(current, value))
            else:
                setattr(node, part, _coerce(key, value, tp))
    validate(out)
    return out


def validate(cfg: Any, prefix: str = "") -> None:
    """Check every field's value against its type and declared range, as an override is checked (so a default or a
    value set in code cannot skip it), then call ``validate()`` on every section that has one (after all overrides,
    so checks may relate fields). Raises :class:`ConfigError` naming the dotted key (``prefix`` + field)."""
    for name, tp in _fields(type(cfg)).items():
        if dataclasses.is_dataclass(value := getattr(cfg, name)):
            validate(value, f"{prefix}{name}.")
        else:
            _coerce(f"{prefix}{name}", value, tp)
    if callable(check := getattr(cfg, "validate", None)):
        check()


# --- Help and CLI ----------------------------------------------------------------------------------------


def _field_docs(cls: type) -> dict[str, str]:
    """The string literal written under each field of a dataclass and its dataclass bases (attribute docstrings;
    a subclass's own text wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else None
        if isinstance(doc, str) and isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            docs[stmt.target.id] = " ".join(doc.split())
    return docs


def _type_name(tp: Any) -> str:
    """How ``--help`` shows a type: ``float > 0``, ``non-empty list[int >= 1]``, ``float in (0, 1] or None``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "{" + ",".join(str(a) for a in args) + "}"
    if origin is Annotated:
        name = _type_name(args[0])
        for bound in args[1:]:
            if isinstance(bound, Range) and str(bound):
                name = f"{name} {bound}"
            elif isinstance(bound, Length):
                name = f"{bound} {name}"
        return name
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin in (list, tuple):
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else _type_name(a) for a in args)}]"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def config_help(cfg: Any, prefix: str = "") -> str:
    """One line per field: ``key (type) = default  doc``."""
    lines = []
    docs = _field_docs(type(cfg))
    for name, tp in _fields(type(cfg)).items():
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            lines.append(f"\n[{prefix}{name}] {docs.get(name, '')}".rstrip())
            lines.append(config_help(value, f"{prefix}{name}."))
        else:
            lines.append(f"  {prefix}{name} ({_type_name(tp)}) = {value!r}  {docs.get(name, '')}".rstrip())
    return "\n".join(lines)


def parse_args(cfg: C, argv: list[str] | None = None, prog: str | None = None, doc: str = "") -> C:
    """Parse ``key=value`` overrides from ``argv`` onto ``cfg``. ``--help`` prints every key and exits; a bad key or
    value prints the error and exits with status 2 (before anything is built)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(f"usage: {prog or sys.argv[0]} [key=value ...]\n")
        if doc:
            print(doc.strip() + "\n")
        print(config_help(cfg))
        raise SystemExit(0)
    with user_errors():
        return apply_overrides(cfg, [a.lstrip("-") for a in argv])


@contextlib.contextmanager
def user_errors():
    """Turn a :class:`UserError` into one line ``error: ...`` on stderr and exit status 2 (``TDRL_DEBUG=1`` keeps
    the traceback), and a :class:`NothingToDo` (a relaunched run that had finished) into one line ``tdrl: ...`` and
    exit status 0."""
    try:
        yield
    except NothingToDo as e:
        print(f"tdrl: {' '.join(str(e).split())}", flush=True)
        raise SystemExit(0) from None
    except UserError as e:
        if os.environ.get("TDRL_DEBUG", "") not in ("", "0"):
            raise
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(2) from None


def run_recipe(main: typing.Callable[[C], Any], cfg: C, *, prog: str | None = None, doc: str = "",
               argv: list[str] | None = None) -> Any:
    """A recipe's command line: ``main(parse_args(cfg, argv, prog, doc))``, where bad input (any
    :class:`UserError`: a config value, an env id, an algorithm the env does not fit, a resource this machine lacks)
    ends with one line and exit status 2; a relaunch of a finished run, with one line saying so and exit status 0
    (:class:`NothingToDo`). A recipe imports only this module at the top and the heavy modules (torch,
    TorchRL, envs) inside ``main``, so a config error shows in well under a second. Ctrl-C and SIGTERM end with one
    line giving the command that resumes the run, and exit status 130 / 143 (:mod:`tdrl.utils.interrupt`).

    A successful run prints tdrl's lines and the progress bar, nothing else: the harmless third-party warnings and
    Ray's start-up lines are silenced while ``main`` runs (:mod:`tdrl.utils.console`; ``TDRL_DEBUG=1`` shows them)."""
    script = sys.argv[0] if argv is None else (prog or sys.argv[0])  # as the user typed it
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(cfg, argv, prog, doc)
    with quiet_console(), interrupts_end_in_one_line(script, argv), user_errors():
        return main(cfg)
