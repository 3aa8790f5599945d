"""Envs for the fault-injection tests, registered on import (``tests.integration.fault_envs:``).

``rppo-train --env tests.integration.fault_envs:rppo_td_fault/Flaky-v0`` imports this module
in the trainer's own process.
"""

from __future__ import annotations

import os
import threading
import time

import gymnasium as gym

from rppo_td.envs import CARTPOLE_NOVEL_ID, register_envs

FAIL_AT_STEP = "RPPO_TD_TEST_FAIL_AT_STEP"


class Flaky(gym.Wrapper):
    """The built-in task; ``step`` raises once an instance has taken ``$FAIL_AT_STEP`` steps.

    The count lives in the instance (pickled with a checkpoint); the threshold is read from the
    environment at every step, so a resumed run without the variable runs on normally.
    """

    def __init__(self) -> None:
        super().__init__(gym.make(CARTPOLE_NOVEL_ID))
        self.steps_taken = 0

    def step(self, action):
        self.steps_taken += 1
        limit = os.environ.get(FAIL_AT_STEP)
        if limit is not None and self.steps_taken >= int(limit):
            raise ZeroDivisionError(f"flaky env gave up after {self.steps_taken} steps")
        return self.env.step(action)


DIE_MARKER = "RPPO_TD_TEST_DIE_MARKER"


class Dies(Flaky):
    """``Flaky``, but its process ends at once (``os._exit``) instead of raising, in the one
    instance that first creates the file ``$DIE_MARKER``: its sibling workers live on."""

    def step(self, action):
        self.steps_taken += 1
        marker = os.environ.get(DIE_MARKER)
        if marker is not None and self.steps_taken >= 3:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(3)
        return self.env.step(action)


STEP_SLEEP = "RPPO_TD_TEST_STEP_SLEEP"


class Slow(gym.Wrapper):
    """The built-in task; each step first sleeps ``$STEP_SLEEP`` seconds (none if unset)."""

    def __init__(self) -> None:
        super().__init__(gym.make(CARTPOLE_NOVEL_ID))

    def step(self, action):
        time.sleep(float(os.environ.get(STEP_SLEEP, "0")))
        return self.env.step(action)


class Unpicklable(gym.Wrapper):
    """The built-in task holding a lock, which cannot be pickled."""

    def __init__(self) -> None:
        super().__init__(gym.make(CARTPOLE_NOVEL_ID))
        self.lock = threading.Lock()


register_envs()  # the wrappers gym.make the built-in task
for _name, _entry in (
    ("Flaky", Flaky),
    ("Dies", Dies),
    ("Slow", Slow),
    ("Unpicklable", Unpicklable),
):
    if f"rppo_td_fault/{_name}-v0" not in gym.registry:
        gym.register(id=f"rppo_td_fault/{_name}-v0", entry_point=_entry)
