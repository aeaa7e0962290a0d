"""The exceptions handlers raise to steer their job, and the lookup error."""

from __future__ import annotations

from datetime import timedelta

from vellum_jobs.conf import parse_duration


class UnknownJob(LookupError):
    """No job function is registered under this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no job registered under the name {name!r}")
        self.name = name


class Retry(Exception):
    """Raise in a handler to run the job again after ``delay``, without using an attempt.

    ``delay`` is a duration (seconds, a timedelta or "90s") of at most 100 years; any
    other, NaN or infinity included, raises ``ValueError`` naming it.
    """

    def __init__(self, delay: float | timedelta = 0) -> None:
        try:
            seconds = parse_duration(delay)
        except ValueError as exc:
            # Refused here, in the handler's traceback, not when the worker adds it to the time.
            raise ValueError(f"Retry delay: {exc}") from None
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
