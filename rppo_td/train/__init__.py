"""``rppo-train``: recurrent PPO on a gymnasium env, on top of the rppo_td pipeline.

``python -m rppo_td.train --help`` lists every setting.
"""

from __future__ import annotations

import json
import logging
import sys

from rppo_td.train._cli import build_parser, config_from_args, list_presets
from rppo_td.train._config import TrainConfig
from rppo_td.train._loop import Trainer, train
from rppo_td.train._outputs import SUMMARY_KEYS

__all__ = [
    "SUMMARY_KEYS",
    "TrainConfig",
    "Trainer",
    "build_parser",
    "list_presets",
    "main",
    "train",
]


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status (0, or 130 when stopped by a signal)."""
    config, given = config_from_args(argv)
    logging.basicConfig(
        level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        summary = Trainer(config, given=given).run()
    except (ValueError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"rppo-train: error: {message}", file=sys.stderr)  # noqa: T201
        return 2
    if summary is None:
        return 130
    print(json.dumps({k: summary[k] for k in SUMMARY_KEYS}, indent=2))  # noqa: T201 (final output)
    return 0
