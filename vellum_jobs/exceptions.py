"""The exceptions handlers raise to steer their job, and the lookup error."""

from __future__ import annotations

from datetime import timedelta


class UnknownJob(LookupError):
    """No job function is registered under this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no job registered under the name {name!r}")
        self.name = name


class Retry(Exception):
    """Raise in a handler to run the job again after ``delay``, without using an attempt."""

    def __init__(self, delay: float | timedelta = 0) -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if seconds < 0:
            raise ValueError(f"Retry delay must not be negative, got {delay!r}")
        super().__init__(f"retry in {seconds:g}s")
        self.delay = seconds


class Fail(Exception):
    """Raise in a handler to fail the job now, with no further attempts."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class WorkerLost(Exception):
    """Never raised: the name a Django task's ``errors`` give an attempt lost with its worker."""


class JobTimeout(Exception):
    """Raised by ``Job.check_timeout()`` once an attempt has run past its timeout."""
