"""``python -m rppo_td.evaluate``: the ``rppo-eval`` command, which lives in ``rppo_td.train``.

Kept for ``-m`` and older imports; ``rppo_td.train.evaluate_main`` and
``rppo_td.train.evaluate_agent`` are the same objects.
"""

from __future__ import annotations

import sys

from rppo_td.train import evaluate_agent
from rppo_td.train import evaluate_main as main

__all__ = ["evaluate_agent", "main"]

if __name__ == "__main__":
    from rppo_td._streams import guard_std_streams

    guard_std_streams()
    sys.exit(main())
