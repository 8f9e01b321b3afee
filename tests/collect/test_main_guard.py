"""A parallel collector built at the top level of a script without ``if __name__ == "__main__":`` ends the
script with one line that says to add the guard (its workers would import the script again)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = """\
from tdrl.collect import make_collector
from tdrl.envs import EnvFactory
c = make_collector("parallel", EnvFactory("CartPole-v1"), None, batch_B=4, batch_T=8, n_workers=2)
print(tuple(c.collect().shape))
c.shutdown()
"""


def _run(script: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, script.name], cwd=script.parent, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.timeout(150)
def test_unguarded_script_fails_in_one_line_and_guarded_one_runs(tmp_path):
    unguarded = tmp_path / "unguarded.py"
    unguarded.write_text(BUILD)
    proc = _run(unguarded)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: this collector starts worker processes, which import unguarded.py again: put the code that builds "
        'it (line 3) under `if __name__ == "__main__":`']
    guarded = tmp_path / "guarded.py"
    guarded.write_text('if __name__ == "__main__":\n' + textwrap.indent(BUILD, "    "))
    proc = _run(guarded)
    assert proc.returncode == 0 and proc.stdout.strip() == "(4, 8)", proc.stderr
