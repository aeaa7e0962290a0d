"""The Oban worker of the benchmark: a module of its own, as Oban names a job's worker by its import path.

``oban start`` imports this module (``--cron-modules``) and resolves each
job's ``worker`` column, ``benchmarks.peers.oban_app.Noop``, to the class.
"""

from __future__ import annotations

from typing import Any

from oban import worker

NAME = "oban_bench"
QUEUE = "default"


class Noop:
    """A no-op job: Oban awaits ``process`` on its event loop."""

    async def process(self, job: Any) -> None:
        return None


# What ``@worker(queue=QUEUE)`` does (it registers the class and adds new() and
# enqueue()), applied by a call so that type checkers see the methods it adds.
noop: Any = worker(queue=QUEUE)(Noop)
