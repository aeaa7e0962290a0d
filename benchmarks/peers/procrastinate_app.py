"""The procrastinate app and its no-op task (a module of their own, as procrastinate asks of an app)."""

from __future__ import annotations

import procrastinate

from benchmarks import database

NAME = "procrastinate_bench"

app = procrastinate.App(connector=procrastinate.PsycopgConnector(kwargs=database.pg_params(NAME)))


@app.task(name="noop")
def noop(i: int = 0) -> None:
    return None
