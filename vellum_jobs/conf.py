"""The only reader of ``settings.VELLUM_JOBS``: defaults and durations, parsed and described.

Every duration (a setting, a delay, a timeout, a backoff, a ``Retry``) is
read by ``parse_duration``, which refuses one that is not a number or is
longer than ``MAX_DURATION``: each is refused where it is given, never
later in a worker adding it to the time.

Values are read on first use and kept until Django reports a change of
``VELLUM_JOBS`` (``setting_changed``, which ``override_settings`` sends), so
tests can change them and nothing is frozen at import time, while a worker
asking for the lease a few times per job pays a dictionary lookup.
"""

from __future__ import annotations

import dataclasses
import math
import re
from datetime import timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS: dict[str, Any] = {
    "WORKERS": 4,
    "ASYNC_WORKERS": 100,
    "ASYNC_BLOCKED_WARNING": 0.1,
    "POLL_INTERVAL": 1.0,
    "PROBE_INTERVAL": 0.025,
    "MAX_ATTEMPTS": 5,
    "BACKOFF_BASE": 30.0,
    "BACKOFF_MAX": 3600.0,
    "LEASE": 60.0,
    "HEARTBEAT": 10.0,
    "MAX_DATABASE_WAIT": None,
    "RETENTION": None,
    "HEALTH": {"MAX_QUEUED_AGE": "5m", "REQUIRE_WORKER": True, "PUBLIC": False},
    "SCHEDULES": {},
    "RUN_INLINE": False,
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    "LISTEN_DATABASE": None,
    "UNKNOWN_NAME_TIMEOUT": 3600.0,
}

DURATION_KEYS = (
    "ASYNC_BLOCKED_WARNING",
    "POLL_INTERVAL",
    "PROBE_INTERVAL",
    "BACKOFF_BASE",
    "BACKOFF_MAX",
    "LEASE",
    "HEARTBEAT",
    "UNKNOWN_NAME_TIMEOUT",
)

# The most coroutine jobs one event loop runs at once (the worker row keeps the number in a small integer).
MAX_ASYNC_WORKERS = 10_000

# The states a finished job can be in, the only ones retention may delete.
RETENTION_STATES = ("done", "failed", "cancelled")

# The longest duration anything takes (a delay, a timeout, a backoff, a setting): 100 years.
# Now plus it stays a valid datetime (to the year 9999) for millennia yet, and a thread
# can wait that long (threading.TIMEOUT_MAX is some 292 years).
MAX_DURATION_YEARS = 100
MAX_DURATION = timedelta(days=365.25 * MAX_DURATION_YEARS)

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


def parse_duration(value: object) -> float:
    """Seconds from an int, float, timedelta or a string like "90s", "15m", "7d".

    Raises ``ValueError`` naming the value and the accepted forms.
    """
    # Workers read durations on every loop; parsing a string each time shows.
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return _parse_cached(value)
    return _parse(value)


def describe_duration(seconds: float) -> str:
    """Seconds in words, in the units ``parse_duration`` reads: "1h 30m", "45s"."""
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return " ".join(parts) or "0s"


@lru_cache(maxsize=256)
def _parse_cached(value: str | int | float) -> float:
    return _parse(value)


def _parse(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match[1]) * _UNITS[match[2]]
    else:
        raise ValueError(
            f"{value!r} is not a duration: use seconds (int or float) "
            'or a string like "90s", "15m", "12h", "7d"'
        )
    if math.isnan(seconds):
        raise ValueError(f"{value!r} is not a duration: it is not a number")
    if seconds < 0:
        raise ValueError(f"{value!r} is not a duration: it is negative")
    if seconds > _MAX_SECONDS:
        raise ValueError(
            f"{value!r} is not a duration: it is longer than {MAX_DURATION_YEARS} years, the longest "
            "vellum-jobs takes (so that now plus it stays a valid datetime)"
        )
    return seconds


_MAX_SECONDS = MAX_DURATION.total_seconds()


@dataclasses.dataclass(frozen=True)
class Health:
    """When the health view answers 503, and whether it needs a login with the view job permission."""

    max_queued_age: float | None
    require_worker: bool
    public: bool


class Settings:
    """Typed access to ``VELLUM_JOBS`` with defaults filled in."""

    def given(self) -> object:
        """``VELLUM_JOBS`` exactly as the project wrote it (for the system checks)."""
        return getattr(settings, "VELLUM_JOBS", {})

    def raw(self) -> dict[str, Any]:
        value = self.given()
        return value if isinstance(value, dict) else {}

    @property
    def use_tz(self) -> bool:
        return bool(settings.USE_TZ)

    @property
    def time_zone(self) -> str:
        return str(settings.TIME_ZONE or "UTC")

    def databases(self) -> dict[str, dict[str, Any]]:
        databases: dict[str, dict[str, Any]] = settings.DATABASES
        return databases

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._seconds: dict[str, float] = {}

    def forget(self, **kwargs: Any) -> None:
        """Drop the values read so far (``setting_changed`` calls it for ``VELLUM_JOBS``)."""
        if kwargs.get("setting", "VELLUM_JOBS") == "VELLUM_JOBS":
            self._values.clear()
            self._seconds.clear()

    def get(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            value = self._values[key] = self.raw().get(key, DEFAULTS[key])
            return value

    def seconds(self, key: str) -> float:
        try:
            return self._seconds[key]
        except KeyError:
            value = self._seconds[key] = parse_duration(self.get(key))
            return value

    @property
    def workers(self) -> int:
        return int(self.get("WORKERS"))

    @property
    def async_workers(self) -> int:
        """Coroutine jobs a worker process runs at once on its event loop (0: it runs none)."""
        return int(self.get("ASYNC_WORKERS"))

    @property
    def async_blocked_warning(self) -> float:
        """How long the event loop may go without a turn before the job holding it is logged."""
        return self.seconds("ASYNC_BLOCKED_WARNING")

    @property
    def max_attempts(self) -> int:
        return int(self.get("MAX_ATTEMPTS"))

    @property
    def poll_interval(self) -> float:
        return self.seconds("POLL_INTERVAL")

    @property
    def probe_interval(self) -> float:
        """MariaDB/MySQL: how often an idle worker's watcher asks the jobs table for news (0: never)."""
        return self.seconds("PROBE_INTERVAL")

    @property
    def backoff_base(self) -> float:
        return self.seconds("BACKOFF_BASE")

    @property
    def backoff_max(self) -> float:
        return self.seconds("BACKOFF_MAX")

    @property
    def lease(self) -> float:
        return self.seconds("LEASE")

    @property
    def heartbeat(self) -> float:
        return self.seconds("HEARTBEAT")

    @property
    def max_database_wait(self) -> float:
        """How long one of a worker's own database calls (a claim, an outcome write, a heartbeat) may
        wait for an answer before the process exits with status 5, for its process manager to start it
        again: nothing else ends the wait of a call on a network path that went silent. ``None``:
        ``LEASE`` plus two ``HEARTBEAT`` intervals (80 s by default); at least ``LEASE`` plus one
        ``HEARTBEAT``, so that the leases have lapsed by then. Not on SQLite, whose waits end with its
        busy timeout."""
        given = self.get("MAX_DATABASE_WAIT")
        if given is None:
            return self.lease + 2 * self.heartbeat
        return self.seconds("MAX_DATABASE_WAIT")

    @property
    def retention(self) -> dict[str, float]:
        """Seconds to keep finished jobs, by state; empty when automatic retention is off."""
        given = self.get("RETENTION") or {}
        return {state: parse_duration(age) for state, age in given.items()}

    @property
    def schedules(self) -> dict[str, Any]:
        """``SCHEDULES`` as written: schedule name -> its entry (see ``maintenance.schedules``)."""
        given = self.get("SCHEDULES")
        return given if isinstance(given, dict) else {}

    @property
    def run_inline(self) -> bool:
        return bool(self.get("RUN_INLINE"))

    @property
    def max_payload_bytes(self) -> int:
        """The most a job's arguments, its result or its error may take, in bytes (see ``payload``)."""
        return int(self.get("MAX_PAYLOAD_BYTES"))

    def listen_database(self, alias: str) -> str | None:
        """The alias whose connection LISTENs for new jobs on ``alias``'s PostgreSQL database; None to poll.

        Unset, ``alias`` itself. Behind a pooler in transaction mode a LISTEN
        misses notifications, so there it names a direct alias, or is False.
        """
        given = self.get("LISTEN_DATABASE")
        if given is False:
            return None
        return alias if given is None else str(given)

    @property
    def unknown_name_timeout(self) -> float:
        """How long a queued job waits while no live worker knows its name (a worker of code from
        before the name was added), counted only while some worker is alive, before it is
        ``failed`` with "no handler registered"."""
        return self.seconds("UNKNOWN_NAME_TIMEOUT")

    def task_backends(self) -> list[str]:
        """The aliases of ``TASKS`` whose backend is vellum-jobs': a worker runs their tasks."""
        tasks = getattr(settings, "TASKS", None) or {}
        return sorted(
            str(alias)
            for alias, entry in tasks.items()
            if isinstance(entry, dict) and str(entry.get("BACKEND", "")).startswith("vellum_jobs.")
        )

    @property
    def health(self) -> Health:
        # A partial HEALTH dict keeps the defaults of the keys it leaves out.
        given = {**DEFAULTS["HEALTH"], **(self.get("HEALTH") or {})}
        age = given["MAX_QUEUED_AGE"]
        return Health(
            max_queued_age=None if age is None else parse_duration(age),
            require_worker=bool(given["REQUIRE_WORKER"]),
            public=bool(given["PUBLIC"]),
        )


conf = Settings()
setting_changed.connect(conf.forget, dispatch_uid="vellum_jobs.conf")
