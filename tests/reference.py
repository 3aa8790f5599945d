"""The loop reference oracle: a re-export of the public ``rppo_td.testing.reference``.

The tests and benchmarks import ``rppo_td.testing`` directly; this module stays for old imports.
"""

from rppo_td.testing.reference import *  # noqa: F403
from rppo_td.testing.reference import __all__  # noqa: F401
