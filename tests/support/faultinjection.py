"""Database errors injected into a worker process's statements, a few percent of them.

A ``runjobs`` process started with ``VELLUM_TEST_FAULTS`` set to a rate
(``"0.03"``) installs an ``Injector`` on every connection it opens: as an
execute wrapper, which sees the ORM's statements and the worker's own on the
driver cursor (``vellum_jobs.store.db.execute``, its BEGIN and COMMIT included),
and around Django's ``commit()``, which is not a statement; but never while
``connect()`` sets a new connection up. A drawn statement fails before it
runs, or after it ran: the change applied and the caller sees an error,
which is what a lost reply looks like.

Each thread draws from its own generator, seeded with
``VELLUM_TEST_FAULTS_SEED`` and the thread's name: the nth statement a thread
runs meets the same fate on every run with one seed, however the threads
were scheduled, and the process's startup (the main thread's first
statements) replays exactly. Which statement is a thread's nth still depends
on timing, so a replay is close, not identical.
``VELLUM_TEST_FAULTS_ERRORS`` (say ``OperationalError,InterfaceError``)
narrows the errors drawn to those classes. Every injection is appended as a
JSON line to ``VELLUM_TEST_FAULTS_LOG``, tagged with the job whose handler
ran the statement, if any; at exit the process adds how many statements it
saw.

A process started with ``VELLUM_TEST_KILL_INSIDE`` (function names, with
their modules, separated by commas) kills itself with SIGKILL at the first
statement one of its threads is about to run with every one of those
functions on its stack (``Killer``): a process dying at a chosen point,
say after an outcome committed and before the jobs waiting for it were
released, as deterministically as a real crash can be placed.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from django.db import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from vellum_jobs import current_job

# What a drawn statement raises, with relative weights: half of the errors
# are transient (a worker waits them out), half are not.
ERRORS: list[tuple[type[Error], str, int]] = [
    (OperationalError, "injected: connection lost", 3),
    (InterfaceError, "injected: connection already closed", 1),
    (DatabaseError, "injected: database error", 1),
    (IntegrityError, "injected: constraint violated", 1),
    (DataError, "injected: value out of range", 1),
    (ProgrammingError, "injected: permission denied", 1),
]
# The share of errors raised after the statement ran.
AFTER = 1 / 3


class Injector:
    """Fails ``rate`` of the statements it sees; an execute wrapper, and the hook around ``commit()``."""

    def __init__(self, rate: float, seed: str, log_path: str = "", errors: str = "") -> None:
        self.rate = rate
        self.seed = seed
        chosen = set(errors.split(",")) if errors else {cls.__name__ for cls, _, _ in ERRORS}
        self.errors = [error for error in ERRORS if error[0].__name__ in chosen]
        if not self.errors:
            raise ValueError(
                f"no error class among {errors!r}; choose from {[e[0].__name__ for e in ERRORS]}"
            )
        self.log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if log_path else -1
        self.local = threading.local()
        self.lock = threading.Lock()
        self.statements = 0

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        fault = self._draw(sql)
        if fault is None:
            return execute(sql, params, many, context)
        error, after = fault
        if after:
            execute(sql, params, many, context)
            # The reply is lost, and with it whatever the statement returned.
            # (Left unread, SQLite's UPDATE ... RETURNING would hold the
            # write lock for as long as anything kept the cursor alive.)
            context["cursor"].close()
        elif _verb(sql) == "COMMIT":
            # A COMMIT that fails ends the transaction all the same (the
            # server rolls it back); a live connection still inside it, its
            # locks held, is a state no real failure leaves behind.
            execute("ROLLBACK", (), False, context)
        self._record(error, after, sql)
        raise error

    def commit(self, connection: BaseDatabaseWrapper, commit: Callable[[], None]) -> None:
        """Django's ``commit()``, which the execute wrappers do not see, failing like a COMMIT statement."""
        fault = self._draw("COMMIT")
        if fault is None or connection.connection is None:
            return commit()
        error, after = fault
        if after:
            commit()
        else:
            connection.connection.rollback()
        self._record(error, after, "COMMIT (Django)")
        raise error

    def install(
        self, sender: Any = None, connection: BaseDatabaseWrapper | None = None, **kwargs: Any
    ) -> None:
        """Hook into ``connection``; a ``connection_created`` receiver (a reconnect adds nothing)."""
        assert connection is not None
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)
        if not getattr(connection, "_injected_commit", False):
            commit = connection._commit  # type: ignore[attr-defined]
            connection._commit = lambda: self.commit(connection, commit)  # type: ignore[attr-defined]
            connection._injected_commit = True  # type: ignore[attr-defined]

    def setting_up(
        self, connect: Callable[[BaseDatabaseWrapper], None]
    ) -> Callable[[BaseDatabaseWrapper], None]:
        """``connect`` with no faults in the statements that set the new connection up."""

        def quietly(connection: BaseDatabaseWrapper) -> None:
            self.local.connecting = True
            try:
                connect(connection)
            finally:
                self.local.connecting = False

        return quietly

    def _draw(self, sql: str) -> tuple[Error, bool] | None:
        # A failed connection setup (MySQL's SET SESSION TRANSACTION
        # ISOLATION LEVEL, the worker's PRAGMA busy_timeout) leaves Django
        # holding a live connection that is set up wrong: a really failing
        # connect has no connection to hold.
        if getattr(self.local, "connecting", False):
            return None
        with self.lock:
            self.statements += 1
        # A ROLLBACK (or ROLLBACK TO SAVEPOINT) always runs: it is how a
        # caller cleans up after an error, and a live connection left inside
        # a transaction it asked to end is again a state no real failure
        # leaves behind (a connection that cannot roll back is gone, and the
        # server ends its transaction).
        if _verb(sql) == "ROLLBACK":
            return None
        generator = self._generator()
        if generator.random() >= self.rate:
            return None
        error_class, message, _ = generator.choices(self.errors, weights=[w for _, _, w in self.errors])[0]
        return error_class(message), generator.random() < AFTER

    def _generator(self) -> random.Random:
        generator: random.Random | None = getattr(self.local, "generator", None)
        if generator is None:
            generator = self.local.generator = random.Random(f"{self.seed}:{threading.current_thread().name}")
        return generator

    def _record(self, error: Error, after: bool, sql: str) -> None:
        job = current_job()
        self._write(
            {
                "pid": os.getpid(),
                "thread": threading.current_thread().name,
                "when": "after" if after else "before",
                "error": type(error).__name__,
                "verb": _verb(sql),
                "sql": sql[:120],
                "job": job.pk if job is not None else None,
                "attempt": job.attempts if job is not None else None,
            }
        )

    def report_statements(self) -> None:
        self._write({"pid": os.getpid(), "statements": self.statements})

    def _write(self, entry: dict[str, Any]) -> None:
        if self.log >= 0:
            # One write of one line, appended: lines from threads and
            # processes sharing the file never interleave.
            os.write(self.log, (json.dumps(entry) + "\n").encode())


def _verb(sql: str) -> str:
    return sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""


def install_from_environment() -> Injector | None:
    """Inject faults into every connection this process opens, if ``VELLUM_TEST_FAULTS`` asks for it."""
    rate = os.environ.get("VELLUM_TEST_FAULTS")
    if not rate:
        return None
    injector = Injector(
        float(rate),
        seed=os.environ.get("VELLUM_TEST_FAULTS_SEED", "0"),
        log_path=os.environ.get("VELLUM_TEST_FAULTS_LOG", ""),
        errors=os.environ.get("VELLUM_TEST_FAULTS_ERRORS", ""),
    )
    connection_created.connect(injector.install, weak=False)
    BaseDatabaseWrapper.connect = injector.setting_up(BaseDatabaseWrapper.connect)  # type: ignore[method-assign,assignment]
    atexit.register(injector.report_statements)
    return injector


class Killer:
    """An execute wrapper that kills its process before a statement run from inside ``inside``.

    ``inside`` names functions as ``module.function``; all of them must be
    on the running thread's stack, so that ``outcome_writes._release_downstream``
    and ``dependencies.mark`` together pick the mark after an outcome, not the
    release duty's.
    """

    def __init__(self, inside: list[str]) -> None:
        self.inside = frozenset(name.strip() for name in inside if name.strip())

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if self.inside <= _on_stack():
            # One write, unbuffered: the test reads where the process died in its stderr.
            os.write(2, f"faultinjection: killed inside {sorted(self.inside)} before {sql[:80]!r}\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)
        return execute(sql, params, many, context)

    def install(
        self, sender: Any = None, connection: BaseDatabaseWrapper | None = None, **kwargs: Any
    ) -> None:
        """Hook into ``connection``; a ``connection_created`` receiver."""
        assert connection is not None
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)


def _on_stack() -> set[str]:
    """The functions on the calling thread's stack, as ``module.function``."""
    names = set()
    frame = sys._getframe(1)
    while frame is not None:
        names.add(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}")
        frame = frame.f_back  # type: ignore[assignment]
    return names


def install_killer_from_environment() -> Killer | None:
    """Kill this process at the point ``VELLUM_TEST_KILL_INSIDE`` names, if it names one."""
    inside = os.environ.get("VELLUM_TEST_KILL_INSIDE")
    if not inside:
        return None
    killer = Killer(inside.split(","))
    connection_created.connect(killer.install, weak=False)
    return killer


def read_log(path: str) -> list[dict[str, Any]]:
    """The entries ``Injector`` processes appended to ``path``."""
    if not os.path.exists(path):
        return []
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]
