"""Loaded (through PYTHONPATH) by the test processes that run on a clock libfaketime shifts.

With the monotonic clock left true (``FAKETIME_DONT_FAKE_MONOTONIC=1``:
faking it breaks every timed wait), libfaketime 0.9.10 still rewrites the
absolute monotonic deadline of ``clock_nanosleep``, on which CPython's
``time.sleep`` waits, and the call fails with EINVAL. Sleep on a condition
variable instead, which waits on the true monotonic clock.
"""

import threading
import time
from typing import SupportsIndex


def _sleep(seconds: "float | SupportsIndex") -> None:
    length = float(seconds)
    if length < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(length)


time.sleep = _sleep
