"""Waking idle MariaDB/MySQL workers: one cheap question to the jobs table every few milliseconds.

MariaDB and MySQL have no LISTEN/NOTIFY and no file a commit writes to, so
a thread asks for the highest job id every ``PROBE_INTERVAL``, on a
connection of its own. That is the last entry of the primary key: one round
trip, no rows read, whatever the table's size. The connection is in
autocommit, so each probe reads a fresh snapshot (in one long REPEATABLE
READ transaction it would never see a new row). A new job raises the
highest id and wakes the worker.

A job whose transaction commits after that of a later-numbered job lands
below the highest id already seen. So when the highest id moves, the probe
also counts the jobs between the ids it has accounted for and the new
highest; while some are missing it counts them on every probe, and wakes
the worker when one lands. After ``HOLE_PATIENCE`` seconds (or ``HOLE_SPAN``
ids) a missing id is taken for a rollback and left to the poll.

Left to the poll (``POLL_INTERVAL``): a resumed queue, a concurrency slot
freed by another process, and jobs another process's heartbeat recovers
(that process wakes itself). A delayed job needs no probe: the dispatcher
sleeps until its ``run_after``.

Why not a version row that every enqueue bumps: each enqueue would write
one hot row and hold its lock until commit, so enqueues in concurrent
transactions would wait for each other. And why not also read the paused
queues on every probe: that doubled the probe's cost on the server.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from contextlib import closing
from typing import Any

from django.db import connections

from vellum_jobs.conf import conf
from vellum_jobs.store.sql import mysql
from vellum_jobs.store.transient_errors import backoff
from vellum_jobs.worker import connections_held

logger = logging.getLogger("vellum_jobs")

# How long, and over how many ids, a hole below the highest id is watched
# for a late commit before it is taken for a rollback. While one is watched
# each probe counts the ids above it, so both bounds keep that count small.
HOLE_PATIENCE = 10.0
HOLE_SPAN = 1000

# A dead link must end a probe in bounded time, not hang the probe's thread.
LINK_TIMEOUTS = {"connect_timeout": 10, "read_timeout": 10, "write_timeout": 10}


@dataclasses.dataclass
class Sighting:
    """What the probes have seen: every id up to ``floor`` is accounted for."""

    floor: int
    top: int  # the highest id seen
    above: int = 0  # jobs seen between the floor and the top
    holes_since: float | None = None

    @property
    def missing(self) -> bool:
        """Whether ids below the top are watched for a late commit."""
        return self.holes_since is not None

    def news(self, top: int, above: int, now: float) -> bool:
        """Take in the highest id and the jobs between the floor and it; whether that is news."""
        changed = (top, above) != (self.top, self.above)
        self.top, self.above = top, above
        if top <= self.floor or above == top - self.floor or self._give_up(now):
            # Every id up to the top is accounted for (or the newest jobs were deleted).
            self.floor, self.above, self.holes_since = top, 0, None
        elif self.holes_since is None:
            self.holes_since = now
        return changed

    def _give_up(self, now: float) -> bool:
        if self.top - self.floor > HOLE_SPAN:
            return True
        return self.holes_since is not None and now - self.holes_since > HOLE_PATIENCE


def watch(alias: str, wake: threading.Event, stop: threading.Event) -> None:
    """Set ``wake`` whenever a probe has news, until ``stop``; survives any database trouble."""
    WakeupProbe(alias, wake, stop, conf.probe_interval).run()


class WakeupProbe:
    """The thread body: probe every ``every`` seconds, reconnect with backoff, never die."""

    def __init__(self, alias: str, wake: threading.Event, stop: threading.Event, every: float) -> None:
        self.alias = alias
        self.wake = wake
        self.stop = stop
        self.every = every
        self.failures = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._probe_until_failure()
            except Exception as exc:  # noqa: BLE001 - the probe must outlive any connection trouble
                self.failures += 1
                delay = backoff(self.failures) * 10
                logger.warning(
                    "wakeup probe lost its connection, reconnecting delay=%.2fs error=%r", delay, exc
                )
                self.stop.wait(delay)

    def _probe_until_failure(self) -> None:
        wrapper = connections[self.alias]
        raw = wrapper.get_new_connection({**LINK_TIMEOUTS, **wrapper.get_connection_params()})
        with closing(raw), connections_held.holding(self.alias):
            raw.autocommit(True)
            cursor = raw.cursor()
            highest, between = mysql.DIALECT.probe_sql(wrapper)
            top = _ask(cursor, highest)
            sighting = Sighting(floor=top, top=top)
            logger.info("wakeup probe connected connection_id=%d every=%gs", raw.thread_id(), self.every)
            # Anything enqueued while nobody was looking would otherwise wait for a poll.
            self.wake.set()
            self.failures = 0
            while not self.stop.wait(self.every):
                top = _ask(cursor, highest)
                if top == sighting.top and not sighting.missing:
                    continue  # the idle case: one query, nothing new
                above = _ask(cursor, between, sighting.floor, top)
                if sighting.news(top, above, time.monotonic()):
                    self.wake.set()


def _ask(cursor: Any, sql: str, *params: int) -> int:
    cursor.execute(sql, params)
    return int(cursor.fetchone()[0] or 0)
