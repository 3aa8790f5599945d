"""Every script under ``examples/`` runs as a subprocess with a tiny budget (``RPPO_TD_TINY=1``).

Each example writes any outputs relative to its working directory, here a temporary one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
# run, with its output checked line by line, by test_distributed_collector.py (and skipped
# there where localhost has no TCP port for gloo)
RUN_ELSEWHERE = {"torchrl_distributed.py"}

# what each example prints when it gets to the end (a crash halfway would not print it)
LAST_WORDS = {
    "pipeline_walkthrough.py": "round trip exact: True",
    "torchrl_collector.py": "update   2",
    "custom_env.py": "expected return is 0",
    "lstm_vs_gru.py": "eval return: deterministic",
    "torchrl_distributed.py": "done: 2 updates",
    "torchrl_masked_cartpole.py": "done: 64 env steps",
}


def test_every_example_is_known() -> None:
    assert {p.name for p in SCRIPTS} == set(LAST_WORDS)


@pytest.mark.parametrize(
    "script",
    [p for p in SCRIPTS if p.name not in RUN_ELSEWHERE],
    ids=[p.name for p in SCRIPTS if p.name not in RUN_ELSEWHERE],
)
def test_example_runs_with_a_tiny_budget(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "RPPO_TD_TINY": "1", "MPLBACKEND": "Agg"}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{script.name} failed:\n{result.stdout}\n{result.stderr}"
    assert LAST_WORDS[script.name] in result.stdout, result.stdout
