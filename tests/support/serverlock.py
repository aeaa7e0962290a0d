"""A database server shared by several test runs, and the tests that restart it.

Runs of different Python and Django versions may share one PostgreSQL or
MariaDB server at the same time, each in a database of its own. A test that
restarts the server would break whatever another run is doing on it, so a
run holds a lock named for the server: shared while it runs a test module,
exclusive for a test marked ``restarts_server``. Held for a whole module, not
a test, so that a module's fixtures (test_pgbouncer's pool of server
connections) never see a restart. A test that waits for the lock waits
before its setup, so none of its own deadlines run meanwhile.

A second lock file, the turnstile, keeps a restart from waiting forever: a
run passes through it on its way in, and a restart holds it while the
modules still running finish, so that no other run starts one meanwhile.
Each run holds one lock at a time and lets go before it asks for another,
so two runs that both restart the server take turns instead of deadlocking.
"""

from __future__ import annotations

import fcntl
import subprocess
import tempfile
from pathlib import Path
from typing import IO

import pytest
from django.db import DatabaseError, connections

from tests.support.processes import wait_for

# How to restart each database server; SQLite has none.
RESTART = {
    "postgresql": "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main restart -m fast",
    "mysql": "mariadb-admin -uroot -h127.0.0.1 shutdown"
    " && while pgrep -x mariadbd >/dev/null; do sleep 0.1; done"
    " && start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd",
}


def restart_server(timeout: float = 60) -> None:
    """Restart the default database's server, and return once it answers this thread's connection.

    Only a test marked ``restarts_server`` may call it: that marker gives it the server alone.
    """
    connection = connections["default"]
    subprocess.run(RESTART[connection.vendor], shell=True, check=True, timeout=timeout, capture_output=True)
    connection.close()
    wait_for_server(timeout)


def wait_for_server(timeout: float) -> None:
    """Wait until the default database answers a query, reconnecting as often as it takes."""
    wait_for(_answers, timeout=timeout, what="the database server to answer")


def _answers() -> bool:
    connection = connections["default"]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        connection.close()  # the next try opens a new connection
        return False
    return True


def lock_paths(settings: dict[str, object]) -> tuple[Path, Path] | None:
    """The turnstile and the lock of the default database's server; None for SQLite, a file."""
    host = settings.get("HOST") or ""
    if not host:
        return None
    stem = f"vellum-jobs-server-{host}-{settings.get('PORT') or 'default'}"
    directory = Path(tempfile.gettempdir())
    return directory / f"{stem}.turnstile", directory / f"{stem}.lock"


def restarts_server(item: pytest.Item) -> bool:
    return item.get_closest_marker("restarts_server") is not None


class ServerLock:
    """This run's hold on its server's lock: none, shared or exclusive."""

    def __init__(self) -> None:
        self.held: IO[str] | None = None
        self.exclusive = False

    def hold(self, exclusive: bool) -> None:
        if self.held is not None and self.exclusive == exclusive:
            return
        self.release()
        paths = lock_paths(connections["default"].settings_dict)
        if paths is None:
            return
        turnstile, lock = paths
        operation = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        with turnstile.open("a") as gate:
            fcntl.flock(gate, operation)
            handle = lock.open("a")
            fcntl.flock(handle, operation)
        self.held, self.exclusive = handle, exclusive
        drop_broken_connections()

    def release(self) -> None:
        if self.held is not None:
            self.held.close()  # closing the file lets go of its lock
            self.held = None

    def after(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """After ``item``: let go unless ``nextitem`` goes on in the same module, the same way."""
        if (
            nextitem is None
            or nextitem.getparent(pytest.Module) is not item.getparent(pytest.Module)
            or restarts_server(nextitem) != restarts_server(item)
        ):
            self.release()


def drop_broken_connections() -> None:
    """Closes this process's connections that a restart by another run broke; they reopen on use."""
    for connection in connections.all(initialized_only=True):
        idle = connection.connection is not None and not connection.in_atomic_block
        if idle and not connection.is_usable():
            connection.close()
