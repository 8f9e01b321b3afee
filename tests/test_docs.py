"""docs/: the API page matches the docstrings; benchmark scripts write dated pages with machine, commit, command."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import markdown_page  # noqa: E402


def test_api_page_is_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "make_api.py"), "--check"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = (ROOT / "docs" / "api.md").read_text()
    assert "**def `make_collector`**" in page and "**class `TransitionReplayBuffer`**" in page


def test_markdown_page_records_machine_commit_command_and_output(tmp_path, capsys):
    path = tmp_path / "docs" / "bench.md"
    argv = [str(ROOT / "benchmarks" / "replay.py"), "--quick", "--markdown", str(path), "--capacity", "10"]
    with markdown_page("Replay throughput", argv):
        print("tdrl-uniform extend 4.38x")
    assert argv[1:] == ["--quick", "--capacity", "10"]  # the script's own parser never sees --markdown
    page = path.read_text()
    assert page.startswith(f"# Replay throughput, {datetime.date.today().isoformat()}\n")
    for line in ("- Machine: ", "cores", "- Software: Python ", "torch ", "- Commit: ",
                 "`python benchmarks/replay.py --quick --capacity 10`", "```text\ntdrl-uniform extend 4.38x\n```"):
        assert line in page
    assert "tdrl-uniform extend 4.38x" in capsys.readouterr().out  # still printed
    with markdown_page("Nothing", ["x.py"]):  # without --markdown: no page
        pass
    assert list(tmp_path.rglob("*.md")) == [path]
