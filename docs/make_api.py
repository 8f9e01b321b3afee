"""Write docs/api.md, the API reference, from the docstrings: ``python docs/make_api.py [--check]``.

One section per public module (its ``__all__``): each name with its signature and the first paragraph of its
docstring. ``--check`` writes nothing and exits 1 when docs/api.md differs from what the docstrings give
(tests/test_docs.py runs it), so the page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "api.md"
MODULES = [
    "tdrl.config", "tdrl.envs", "tdrl.models", "tdrl.collect", "tdrl.replay",
    "tdrl.objectives.advantage", "tdrl.objectives.policy_gradient", "tdrl.objectives.dqn",
    "tdrl.objectives.continuous", "tdrl.objectives.sac", "tdrl.objectives.update", "tdrl.objectives.graphs",
    "tdrl.objectives.schedules", "tdrl.objectives.value_decomposition", "tdrl.envs.matrix_games", "tdrl.envs.vmas",
    "tdrl.train", "tdrl.distributed", "tdrl.wiring", "tdrl.log", "tdrl.ckpt", "tdrl.launch", "tdrl.launch.recipe",
    "tdrl.plot",
]


def first_paragraph(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def signature(obj: object) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return re.sub(r" at 0x[0-9a-f]+", "", text)  # no addresses: the page must be reproducible


def methods(cls: type) -> list[str]:
    """The public methods a class defines itself, with a docstring of their own (inherited ones are documented
    where they are defined)."""
    found = []
    for name, member in vars(cls).items():
        function = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if not name.startswith("_") and inspect.isfunction(function) and function.__doc__:
            found.append(name)
    return found


def render() -> str:
    lines = ["# API reference", "", "Generated from the docstrings by `python docs/make_api.py`; do not edit by hand.",
             "Each entry: the signature and the first paragraph of the docstring (`help(name)` has the rest).", ""]
    for name in MODULES:
        module = importlib.import_module(name)
        lines += [f"## `{name}`", "", first_paragraph(module), ""]
        for public in sorted(getattr(module, "__all__", [])):
            obj = getattr(module, public)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                kind = "class" if inspect.isclass(obj) else "def"
                lines += [f"- **{kind} `{public}`**`{signature(obj)}`: {first_paragraph(obj)}".rstrip(": ")]
                if inspect.isclass(obj):
                    lines += [f"  - **`{public}.{method}`**`{signature(getattr(obj, method))}`: "
                              f"{first_paragraph(getattr(obj, method))}".rstrip(": ") for method in methods(obj)]
            else:
                text = repr(sorted(obj) if isinstance(obj, (set, frozenset)) else obj)  # sets: a fixed order
                text = re.sub(r" at 0x[0-9a-f]+", "", text)
                lines += [f"- `{public}` = `{text}`" if len(text) < 100 else f"- `{public}`"]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = PAGE.read_text() if PAGE.is_file() else ""
        if current != text:
            print(f"{PAGE} is out of date: run python docs/make_api.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"{PAGE}: {len(text):,} characters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
