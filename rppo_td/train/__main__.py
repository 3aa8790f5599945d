"""``python -m rppo_td.train``."""

from rppo_td.train import cli

cli()
