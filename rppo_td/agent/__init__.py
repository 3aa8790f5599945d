"""Moved to ``rppo_td.modules``; this name stays for existing imports."""

from rppo_td.modules import *  # noqa: F403
from rppo_td.modules import __all__  # noqa: F401
