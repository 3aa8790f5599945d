"""The project's hypothesis strategies: a re-export of the public ``rppo_td.testing.strategies``.

The tests import ``rppo_td.testing`` directly; this module stays for old imports.
"""

from rppo_td.testing.strategies import *  # noqa: F403
from rppo_td.testing.strategies import __all__  # noqa: F401
