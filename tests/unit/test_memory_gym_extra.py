"""The Memory Gym extra's parts that need no memory-gym installed: registration, the
missing-extra error, the presets (test_memory_gym.py, skipped without the package, steps the
tasks themselves)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rppo_td.envs import EnvError, make_env
from rppo_td.envs._memory_gym import INSTALL_HINT, make_memory_gym
from rppo_td.train._cli import config_from_args


def test_registration_does_not_import_memory_gym():
    code = (
        "import sys, gymnasium as gym, rppo_td.envs\n"
        "assert gym.spec('rppo_td/SearingSpotlights-v0').entry_point.endswith(':make_memory_gym')\n"
        "print('memory_gym' in sys.modules, 'pygame' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["False", "False"]


def test_a_missing_extra_names_the_install_commands(monkeypatch):
    monkeypatch.setitem(sys.modules, "memory_gym", None)  # import memory_gym now fails
    with pytest.raises(ImportError, match="memory-gym extra") as err:
        make_memory_gym("MortarMayhem-Grid-v0")
    assert INSTALL_HINT in str(err.value)
    assert 'pip install --no-deps "memory-gym>=1.0.1"' in INSTALL_HINT
    assert "pip install -e '.[memory-gym]'" in INSTALL_HINT
    assert "pip install 'rppo_td[memory-gym]'" in INSTALL_HINT
    with pytest.raises(EnvError, match="--no-deps"):
        make_env("rppo_td/MortarMayhem-Grid-v0")


PRESETS = {
    "mortar-mayhem": "rppo_td/MortarMayhem-v0",
    "mortar-mayhem-grid": "rppo_td/MortarMayhem-Grid-v0",
    "mystery-path": "rppo_td/MysteryPath-v0",
    "mystery-path-grid": "rppo_td/MysteryPath-Grid-v0",
    "searing-spotlights": "rppo_td/SearingSpotlights-v0",
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_take_the_seed_designs_settings(preset):
    config, _ = config_from_args(["--preset", preset])
    assert config.env == PRESETS[preset] and config.total_steps >= 80_000_000
    assert (config.recurrence, config.hidden_size) == ("gru", 512)
    assert (config.num_workers, config.rollout_steps) == (32, 512)
    assert config.sequence_length == config.rollout_steps  # whole episodes within a rollout
