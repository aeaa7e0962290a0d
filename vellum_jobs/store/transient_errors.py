"""Riding out database trouble: which errors pass, and retrying with backoff until they do.

"database is locked", a dropped connection, a server restart and a MySQL
deadlock all surface as ``OperationalError`` or ``InterfaceError``. They are
worth waiting out; anything else is a bug and is raised.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

logger = logging.getLogger("vellum_jobs")

T = TypeVar("T")

TRANSIENT = (OperationalError, InterfaceError)
FIRST_DELAY, MAX_DELAY = 0.05, 5.0


def log_failure(message: str, exc: BaseException, *args: object) -> None:
    """Log a failure that is tried again later: a transient one as a warning, without a traceback
    (the database is out of reach, or a lock wait ran out); any other, a bug, as an error with one."""
    if isinstance(exc, TRANSIENT):
        logger.warning(message + " error=%r", *args, exc)
    else:
        logger.error(message + " error=%r", *args, exc, exc_info=exc)


def reset_connection(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Drop this thread's connection after an error, so the next query reconnects."""
    connection = connections[alias]
    if connection.in_atomic_block:
        return
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is gone either way
        connection.connection = None


def backoff(attempt: int) -> float:
    """The wait before retry ``attempt`` (1-based): doubling, capped, with jitter."""
    delay: float = min(FIRST_DELAY * 2.0 ** (attempt - 1), MAX_DELAY)
    return delay * random.uniform(0.5, 1.0)


def retry(
    action: Callable[[], T],
    *,
    what: str,
    alias: str = DEFAULT_DB_ALIAS,
    give_up_after: float | None = None,
    stop: threading.Event | None = None,
) -> T:
    """Call ``action`` until it gets past transient database errors.

    Gives up (re-raising the last error) after ``give_up_after`` seconds, or
    as soon as ``stop`` is set; retries forever when neither is given.
    """
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return action()
        except TRANSIENT as exc:
            attempt += 1
            reset_connection(alias)
            elapsed = time.monotonic() - started
            if (give_up_after is not None and elapsed >= give_up_after) or (stop and stop.is_set()):
                raise
            delay = backoff(attempt)
            log = logger.info if attempt == 1 else logger.warning
            log(
                "database trouble during %s; retrying in %.2fs what=%s attempt=%d delay=%.2fs error=%r",
                what,
                delay,
                what,
                attempt,
                delay,
                exc,
            )
            if stop is not None:
                if stop.wait(delay):
                    raise
            else:
                time.sleep(delay)
