"""Keeping the process-wide random generators out of third-party hands.

Some libraries seed Python's, NumPy's and torch's global generators when imported or when they run
(mteb seeds all three with 42). Everything else in the process then draws the same numbers every
time: two `embforge run` started together picked the same port for their temporary Prefect
servers. What such a library does inside `global_rng_kept()` leaves the generators as they were.

Stages run in threads of one process (`run.task_runner: threads`) share these generators too: what
seeds and draws from them holds GLOBAL_RNG (tasks/core/parallel.py), so no other stage's draws land in
its stream and its numbers are the ones a sequential run gets.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch

from tasks.core.parallel import GLOBAL_RNG


@contextlib.contextmanager
def global_rng_kept() -> Iterator[None]:
    with GLOBAL_RNG:
        states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        try:
            yield
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])
