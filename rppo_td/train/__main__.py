"""``python -m rppo_td.train``."""

import sys

from rppo_td.train import main

sys.exit(main())
