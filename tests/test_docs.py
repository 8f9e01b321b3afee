"""docs/: the API page matches the docstrings; benchmark scripts write their sections of the topic pages in place,
with date, machine, commit and command; docs/ stays a handful of pages whose links resolve."""

from __future__ import annotations

import ast
import dataclasses
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import pytest  # noqa: E402
from report import heading_link, headings, markdown_page, scrub_paths  # noqa: E402


def test_api_page_is_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "make_api.py"), "--check"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = (ROOT / "docs" / "api.md").read_text()
    assert "**def `make_collector`**" in page and "**class `TransitionReplayBuffer`**" in page
    assert "**`Run.open`**" in page and "## `tdrl.launch.recipe`" in page and "**def `load_recipe`**" in page


def test_every_benchmark_lists_markdown_in_its_help():
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        source = script.read_text()
        if "markdown_page(" in source and script.name != "report.py":
            assert "add_markdown_option(parser)" in source, f"{script.name}: --help does not list --markdown"


def test_no_tracked_file_holds_a_machine_path():
    """A page generated on one machine (a default argument's absolute path) fails a fresh install elsewhere."""
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    machine = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.executable, Path.home(), ROOT)}
    patterns = [*sorted(machine - {"/"}), "/.pyenv/", "site-packages/", "/home/"]
    found = []
    for name in tracked:
        if name == "tests/test_docs.py":
            continue  # names the patterns
        path = ROOT / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not text a reader copies
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{name}:{number}: {pattern}" for pattern in patterns if pattern in line]
    assert not found, "\n".join(found)


# --- docs/ is a handful of pages, and every reference to one resolves -----------------------------------------------

MAX_DOCS_ENTRIES = 15  # evergreen pages, one results page per topic, data/ (issue 47)
DATED = re.compile(r"20\d\d-\d\d-\d\d")
DOCS_REFERENCE = re.compile(r"(?<![\w/.-])docs/([\w./-]*\w)(?:#([\w-]+))?")  # docs/x.md#anchor in any file
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) in a page
REFERRING = ["README.md", "Makefile", "docs/**/*.md", "tdrl/**/*.py", "recipes/**/*.py", "benchmarks/**/*.py",
             "slurm/**/*.py", "slurm/**/*.sh", "tests/**/*.py"]


def _anchors(page: Path) -> set[str]:
    return {heading_link(h.text) for h in headings(page.read_text())}


def _broken(target: Path, anchor: str | None) -> str | None:
    """Why a reference to ``target`` (``#anchor``) does not resolve, or None."""
    if DATED.search(str(target)):
        return "a dated page (docs/ has one page per topic)"
    if not target.exists():
        return "no such file"
    if anchor and target.suffix == ".md" and anchor not in _anchors(target):
        return f"no heading #{anchor} there"
    return None


def _references():
    """(where, target path, anchor) for every docs/ path in the tree's code and pages, and every relative link of
    README.md and the docs pages."""
    files = sorted({f for pattern in REFERRING for f in ROOT.glob(pattern)} - {Path(__file__)})
    for path in files:
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            for match in DOCS_REFERENCE.finditer(line):
                yield where, ROOT / "docs" / match.group(1), match.group(2)
            if path.suffix == ".md":
                for link in MARKDOWN_LINK.findall(line):
                    if not link.startswith(("http://", "https://", "mailto:")):
                        file, _, anchor = link.partition("#")
                        yield where, (path.parent / file) if file else path, anchor or None


def test_docs_is_a_handful_of_undated_pages():
    entries = sorted(p.name for p in (ROOT / "docs").iterdir() if not p.name.startswith("."))
    assert len(entries) <= MAX_DOCS_ENTRIES, entries
    dated = [str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*") if DATED.search(p.name)]
    assert not dated, f"dated names (update the topic page in place instead): {dated}"


def test_every_reference_to_a_docs_page_resolves():
    """README, the pages, the code, the tests and the sweep files name docs pages that exist (topic pages, not dated
    ones), and headings that exist on them."""
    problems, checked = [], 0
    for where, target, anchor in _references():
        checked += 1
        if why := _broken(target, anchor):
            problems.append(f"{where}: {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}"
                            f"{'#' + anchor if anchor else ''}: {why}")
    assert checked > 50, checked
    assert not problems, "\n".join(problems)


def test_results_blocks_say_when_where_and_how():
    """Every measured block of a results page opens with its date, machine, commit and command."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        for block in re.finditer(r"<!-- results:([\w-]+) -->\n(.*?)<!-- /results:\1 -->", text, re.S):
            for field in ("- Date: ", "- Machine: ", "- Commit: ", "- Command (from the repository root): `"):
                assert field in block.group(2), f"{page.name}#{block.group(1)}: no '{field}'"


def test_markdown_page_records_machine_commit_command_and_output(tmp_path, capsys):
    path = tmp_path / "docs" / "bench.md"
    argv = [str(ROOT / "benchmarks" / "replay.py"), "--quick", "--markdown", str(path), "--capacity", "10"]
    with markdown_page("Replay throughput", argv):
        print("tdrl-uniform extend 4.38x")
    assert argv[1:] == ["--quick", "--capacity", "10"]  # the script's own parser never sees --markdown
    page = path.read_text()
    assert page.startswith("# Replay throughput\n\n<!-- results:replay-throughput -->\n")
    for line in (f"- Date: {datetime.date.today().isoformat()}; wall time ", "- Machine: ", "cores",
                 "- Software: Python ", "torch ", "- Commit: ", "`python benchmarks/replay.py --quick --capacity 10`",
                 "```text\ntdrl-uniform extend 4.38x\n```\n<!-- /results:replay-throughput -->\n"):
        assert line in page
    assert "tdrl-uniform extend 4.38x" in capsys.readouterr().out  # still printed
    with markdown_page("Nothing", ["x.py"]):  # without --markdown: no page
        pass
    assert list(tmp_path.rglob("*.md")) == [path]


def test_markdown_page_rewrites_its_section_in_place(tmp_path):
    """A rerun replaces its own block and nothing else: the hand-written text, the other sections; the index
    (the page's header) lists each section's date, commit, machine and command."""
    path = tmp_path / "throughput.md"
    path.write_text("# Throughput\n\nIntro.\n\n<!-- index -->\n<!-- /index -->\n\n## Replay\n\nBy hand.\n\n"
                    "```text\n## printed, not a heading\n```\n\n## Collectors\n\nAlso by hand.\n")
    script = str(ROOT / "benchmarks" / "replay.py")
    for rows, section in (("first", "replay"), ("c", "collectors"), ("second", "replay")):
        with markdown_page("Replay throughput", [script, "--markdown", f"{path}#{section}"]):
            print(f"{rows} run")
            assert f"{rows} run" in path.read_text()  # written as printed
    page = path.read_text()
    assert page.count("<!-- results:replay -->") == 1 and "first run" not in page and "second run" in page
    assert page.index("By hand.") < page.index("second run") < page.index("## Collectors") < page.index("c run")
    assert "Intro." in page and "Also by hand." in page and "## printed, not a heading" in page
    index = page[page.index("<!-- index -->"):page.index("<!-- /index -->")].splitlines()
    assert [row.split(" | ")[0] for row in index[3:]] == ["| [Replay](#replay)", "| [Collectors](#collectors)"]
    assert f"| {datetime.date.today().isoformat()} | " in index[3] and "`python benchmarks/replay.py` |" in index[3]
    with markdown_page("Update throughput", [str(ROOT / "benchmarks/updates.py"), "--markdown", str(path)]):
        print("new")
    assert path.read_text().endswith("## Update throughput\n\n<!-- results:update-throughput -->\n" +
                                     path.read_text().split("<!-- results:update-throughput -->\n")[1])
    assert heading_link("Ape-X and IMPALA on Ray: `trainer.kind=ray`") == "ape-x-and-impala-on-ray-trainerkindray"


def test_pages_shorten_machine_paths(tmp_path, monkeypatch):
    """A traceback printed on a lent GPU machine names its site-packages, its PYTHONPATH and this checkout; the page
    names none of them (test_no_tracked_file_holds_a_machine_path would fail on it)."""
    monkeypatch.setenv("PYTHONPATH", f"/tmp/tdrl-site{os.pathsep}{ROOT}")
    text = (f'  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py", line 1833\n'
            f'  File "/tmp/tdrl-site/torchrl/objectives/common.py", line 64\n'
            f'  File "{ROOT}/tdrl/objectives/policy_gradient.py", line 50\n  {sys.prefix}/bin/python {Path.home()}/x\n')
    assert scrub_paths(text) == ('  File "<site>/torch/nn/modules/module.py", line 1833\n'
                                 '  File "<site>/torchrl/objectives/common.py", line 64\n'
                                 '  File "tdrl/objectives/policy_gradient.py", line 50\n  <python>/bin/python ~/x\n')
    path = tmp_path / "page.md"
    with markdown_page("Paths", ["x.py", "--markdown", str(path)]):
        print(text)
        assert "site-packages" not in path.read_text() and "<site>/torchrl" in path.read_text()  # written as printed
    assert "site-packages" not in path.read_text() and path.read_text().endswith("```\n<!-- /results:paths -->\n")


# --- Config keys named in the docs exist ----------------------------------------------------------------------
# Every `section.key` or `section.key=value` in README.md and docs/*.md (inline code, shell blocks; not Python
# blocks, where `trainer.frames` is an attribute) is checked against the recipes' configs: in a command
# `python recipes/<r>.py ...` against that recipe, with all of its overrides together (as a code span's are);
# elsewhere against the recipes the same line names (`PPO`, `a2c.py`), or any recipe when it names none. A shell
# line whose comment says `error:` shows bad input on purpose: it must fail. The commands in the recipes' docstrings
# (their --help) are checked the same way.

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ALGORITHMS = {"ppo": "PPO", "a2c": "A2C", "dqn": "DQN", "ddpg": "DDPG", "td3": "TD3", "sac": "SAC", "r2d1": "R2D1",
              "impala": "IMPALA", "mappo": "MAPPO", "qmix": "QMIX", "maddpg": "MADDPG"}
NOT_CONFIG_KEYS = {"collector.traj_infos": "a collector's attribute", "logger.record_tabular": "rlpyt's function"}
COMMAND = re.compile(r"python\s+(?:\S*/)?recipes/(\w+)\.py((?:[ \t]+[^\s#`|]+)*)")
KEY = re.compile(r"(?<![\w./-])([a-z][a-z_]*)\.([A-Za-z_][A-Za-z0-9_]*)(?:=([^\s`|,;)\]\"']+))?(?![\w(.])")
PLACEHOLDER = re.compile(r"^([A-Z]|<.*>|\.\.\.)$")  # trainer.world_size=N, run.dir=<dir>


def _recipe_configs():
    from tdrl.launch.recipe import load_recipe

    return {name: load_recipe(ROOT / "recipes" / f"{name}.py").Config() for name in ALGORITHMS}


def _named_recipes(text: str) -> list[str]:
    return [r for r, algo in ALGORITHMS.items() if re.search(rf"\b({algo}|{r}\.py)\b", text)]


def _doc_spans(text: str):
    """(line number, context, span, shows an error) for each inline code span and each line of a non-Python block;
    the context, where the recipes a span is about are named, is the text after the span when that names one."""
    in_block, python_block = False, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_block, python_block = not in_block, line.strip().removeprefix("```").startswith("python")
            continue
        if in_block:
            if not python_block:
                code, _, comment = line.partition("  #")
                yield number, line, code, comment.strip().startswith("error:")
        else:
            parts = line.split("`")  # odd indices are code spans; the text after one says what it is about
            for i in range(1, len(parts) - 1, 2):
                after = parts[i + 1]
                yield number, after if _named_recipes(after) else line, parts[i], False


def _doc_mentions():
    """Every config mention in the docs: (where, recipes it is checked against, overrides, must fail)."""
    configs = _recipe_configs()
    sections = {f for cfg in configs.values() for f in dataclasses.asdict(cfg)}
    for path in DOC_FILES:
        for number, line, span, error in _doc_spans(path.read_text().replace("\\\n", " ")):
            where = f"{path.relative_to(ROOT)}:{number}: {span.strip()[:100]}"
            for match in COMMAND.finditer(span):
                overrides = [a for a in match.group(2).split() if "=" in a and not a.startswith("-")]
                yield where, [match.group(1)], overrides, error
            named = _named_recipes(line)
            overrides = [f"{section}.{key}" + (f"={value}" if value and not PLACEHOLDER.match(value) else "")
                         for section, key, value in KEY.findall(COMMAND.sub("", span))
                         if section in sections and f"{section}.{key}" not in NOT_CONFIG_KEYS]
            if overrides:  # a span's overrides together, as a command line would give them
                yield where, named or list(ALGORITHMS), overrides, error


def _docstring_commands():
    """The commands in each recipe's docstring (its ``--help``): (where, [recipe], overrides, must fail)."""
    for recipe in ALGORITHMS:
        path = ROOT / "recipes" / f"{recipe}.py"
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        for number, line in enumerate(doc.replace("\\\n", " ").splitlines(), 1):
            code, _, comment = line.partition("  #")
            for match in COMMAND.finditer(code):
                overrides = [a for a in match.group(2).split() if "=" in a and not a.startswith("-")]
                yield f"recipes/{recipe}.py docstring:{number}", [match.group(1)], overrides, "error:" in comment


def _config_error(config, overrides: list[str]) -> str | None:
    from tdrl.config import ConfigError, apply_overrides, flatten, to_dict

    keys = flatten(to_dict(config))
    if missing := [o for o in overrides if "=" not in o and o not in keys]:
        return f"no key {missing[0]}"
    try:
        apply_overrides(config, [o for o in overrides if "=" in o])
    except ConfigError as e:
        return str(e)
    return None


def test_every_config_key_in_the_docs_exists():
    configs = _recipe_configs()
    problems, checked = [], 0
    for where, recipes, overrides, must_fail in [*_doc_mentions(), *_docstring_commands()]:
        checked += 1
        errors = {recipe: _config_error(configs[recipe], overrides) for recipe in recipes}
        failed = [f"{recipe}: {error}" for recipe, error in errors.items() if error]
        if must_fail:
            if len(failed) < len(recipes):
                problems.append(f"{where} -> shown as an error, but it is valid")
        elif len(failed) == len(recipes) or (len(recipes) < len(ALGORITHMS) and failed):
            problems.append(f"{where} -> {'; '.join(failed)}")
    assert checked > 80, checked  # the scan found the docs' keys
    assert not problems, "\n".join(problems)
