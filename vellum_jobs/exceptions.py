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


class Throttled(Exception):
    """Raise in a handler told to slow down ("429, retry in 30 s"): no job under ``key`` starts, on
    any worker, for ``seconds``, and this job runs again then, without using an attempt.

    ``key`` is a limit key of the jobs to hold (a key of their ``rate=`` or
    ``concurrency={...}``). ``seconds`` is a duration (seconds, a timedelta or
    "30s") of at most 100 years; any other raises ``ValueError`` naming it.
    """

    def __init__(self, key: str, seconds: float | timedelta = 1, reason: str = "") -> None:
        if not isinstance(key, str) or not 0 < len(key) <= 255:
            raise ValueError(f"Throttled key must be a string of 1 to 255 characters, got {key!r}")
        try:
            delay = parse_duration(seconds)
        except ValueError as exc:
            raise ValueError(f"Throttled seconds: {exc}") from None
        super().__init__(f"{key} throttled for {delay:g}s" + (f": {reason}" if reason else ""))
        self.key, self.seconds, self.reason = key, delay, reason


class Fail(Exception):
    """Raise in a handler to fail the job now, with no further attempts."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class WorkerLost(Exception):
    """Never raised: the name a Django task's ``errors`` give an attempt lost with its worker."""


class JobTimeout(Exception):
    """Raised by ``Job.check_timeout()`` once an attempt has run past its timeout."""
