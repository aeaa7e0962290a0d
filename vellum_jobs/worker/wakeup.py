"""Waking idle workers when a job is enqueued, without busy polling the jobs table.

PostgreSQL: the enqueue sends ``NOTIFY`` in its own transaction, so it is
delivered on commit, when the job is visible; each worker process LISTENs on
a dedicated connection. SQLite: ``PRAGMA data_version`` changes whenever
another connection commits; a thread reads it each time inotify reports a
write to the database's files (every few milliseconds where there is no
inotify), so an idle worker costs next to nothing. MariaDB/MySQL have
neither: a thread probes the jobs table every ``PROBE_INTERVAL`` (``probe``).
A wakeup is only a hint: the worker's poll at ``POLL_INTERVAL`` stays the
ground truth, so a lost notification delays a job, never strands it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from django.db import connections

from vellum_jobs.conf import conf
from vellum_jobs.store import sql
from vellum_jobs.store.transient_errors import backoff
from vellum_jobs.worker import connections_held, wakeup_probe
from vellum_jobs.worker.file_changes import FileChanges

logger = logging.getLogger("vellum_jobs")

# Where inotify is missing (not Linux), how often to read data_version.
SQLITE_CHECK_EVERY = 0.005
# With inotify, how often to read it all the same, should inotify miss a write.
SQLITE_LOOK_EVERY = 0.25


def start_watcher(alias: str, wake: threading.Event, stop: threading.Event) -> str:
    """Start the thread that sets ``wake`` on news of a job; returns how it watches."""
    connection = connections[alias]
    if connection.vendor == "postgresql" and _psycopg3(connection):
        # LISTEN_DATABASE may name another alias: a pooler in transaction mode
        # hands each transaction any server connection, so a LISTEN through
        # it misses the notifications (an enqueue's NOTIFY may go through it).
        listen = conf.listen_database(alias)
        if listen is None:
            return "polling"
        target, how = (
            _listen_postgresql,
            "LISTEN/NOTIFY" if listen == alias else f"LISTEN/NOTIFY on {listen!r}",
        )
        alias = listen  # the listener's connection only; the worker's stay on the queue's alias
    elif connection.vendor == "sqlite" and not connection.is_in_memory_db():  # type: ignore[attr-defined]
        target, how = _watch_sqlite_data_version, "PRAGMA data_version"
    elif connection.vendor == "mysql" and conf.probe_interval > 0:
        target, how = wakeup_probe.watch, f"probe every {conf.probe_interval * 1000:g}ms"
    else:
        return "polling"
    thread = threading.Thread(target=target, args=(alias, wake, stop), name="vellum-wakeup", daemon=True)
    thread.start()
    return how


def _psycopg3(connection: Any) -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def _listen_postgresql(alias: str, wake: threading.Event, stop: threading.Event) -> None:
    failures = 0
    while not stop.is_set():
        try:
            _listen_until_failure(alias, wake, stop)
        except Exception as exc:  # noqa: BLE001 - the listener must outlive any connection trouble
            failures += 1
            delay = backoff(failures) * 10
            logger.warning(
                "wakeup listener lost its connection, reconnecting delay=%.2fs error=%r", delay, exc
            )
            stop.wait(delay)


def _listen_until_failure(alias: str, wake: threading.Event, stop: threading.Event) -> None:
    wrapper = connections[alias]
    raw = wrapper.get_new_connection(wrapper.get_connection_params())
    with closing(raw), connections_held.holding(alias):
        raw.autocommit = True
        raw.execute(sql.of(wrapper).listen_sql(wrapper))
        # Anything enqueued while we were not listening would otherwise wait for a poll.
        wake.set()
        while not stop.is_set():
            # Returns after the first notification or a second of silence;
            # a dead connection raises, and we reconnect.
            for _ in raw.notifies(timeout=1.0, stop_after=1):
                wake.set()


def _watch_sqlite_data_version(alias: str, wake: threading.Event, stop: threading.Event) -> None:
    path = Path(str(connections[alias].settings_dict["NAME"])).resolve()
    watcher = sqlite3.connect(str(path), check_same_thread=False)
    check = watcher.cursor()
    changes = FileChanges.of(path.parent, {f"{path.name}-wal", path.name})
    try:
        last = sql.sqlite.DIALECT.data_version(check)
        pending = False  # a write seen while the dispatcher was awake anyway
        while not stop.is_set():
            # With inotify, sleep until a commit touches the database files
            # (no CPU at all while idle); without it, poll every few ms.
            touched = False
            if changes is not None:
                touched = changes.wait(SQLITE_CHECK_EVERY if pending else SQLITE_LOOK_EVERY)
            else:
                time.sleep(SQLITE_CHECK_EVERY)
            if wake.is_set():
                # The dispatcher runs a cycle, and claims, after this moment: reading the
                # version now would only cost it CPU (a busy worker's own commits touch the
                # files hundreds of times a second). The write is looked at once it sleeps.
                pending = pending or touched
                continue
            touched, pending = touched or pending, False
            try:
                version = _data_version(check, last, settle=SQLITE_COMMIT_SETTLE if touched else 0.0)
            except sqlite3.Error as exc:
                logger.warning("SQLite data_version check failed; polling until it answers error=%r", exc)
                stop.wait(1.0)
                continue
            if version != last:
                last = version
                wake.set()
    finally:
        if changes is not None:
            changes.close()
        watcher.close()


# A commit writes its frames to the WAL (the inotify event) and then, last,
# the WAL index in shared memory, which makes no event. Woken between the
# two, the watcher would see no new data_version and sleep on while the new
# job waits; so after a write it looks again for this long.
SQLITE_COMMIT_SETTLE = 0.05


def _data_version(check: sqlite3.Cursor, last: int, settle: float) -> int:
    """The database's data_version; if ``settle``, wait up to that long for it to move past ``last``."""
    deadline = time.monotonic() + settle
    while True:
        version = sql.sqlite.DIALECT.data_version(check)
        if version != last or time.monotonic() >= deadline:
            return version
        time.sleep(0.001)
