"""``python -m rppo_td.train``."""

from rppo_td._streams import guard_std_streams
from rppo_td.train import cli

guard_std_streams()
cli()
