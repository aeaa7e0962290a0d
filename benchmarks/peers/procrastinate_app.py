"""The procrastinate app and its tasks (a module of their own, as procrastinate asks of an app)."""

from __future__ import annotations

import asyncio

import procrastinate

from benchmarks import database

NAME = "procrastinate_bench"

app = procrastinate.App(connector=procrastinate.PsycopgConnector(kwargs=database.pg_params(NAME)))


@app.task(name="noop")
def noop(i: int = 0) -> None:
    return None


@app.task(name="pause_async")
async def pause_async(seconds: float) -> None:
    """Waits on the worker's event loop, as a job awaiting a reply would."""
    await asyncio.sleep(seconds)
