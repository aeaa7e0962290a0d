"""The queue-wide duties a worker process performs at each heartbeat, for every worker.

Each beat, after the process has renewed its own leases and recorded its
row, it requeues any worker's jobs whose lease lapsed (``recovery``), adds
the outcomes it wrote to the per-minute figures (``rollup``), and runs
retention, the unknown-name duty (``unknown_names``), the release duty
(``releases``) and the limit-pruning duty (``limit_pruning``), each of which only
one process at a time performs, whichever takes its maintenance lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from vellum_jobs.execution import job_signals
from vellum_jobs.maintenance import limit_pruning, recovery, releases, retention, unknown_names
from vellum_jobs.store import rollup
from vellum_jobs.store.announce import announce


class Duties:
    """The duties one process performs on ``alias``, as ``holder`` of their maintenance locks."""

    def __init__(self, alias: str, holder: uuid.UUID, recovered: Callable[[], None] = lambda: None) -> None:
        self.alias = alias
        self.holder = holder
        self.recovered = recovered  # told at once when jobs were recovered: they are free to claim
        self.lapses = recovery.LapseWatch()  # other workers' leases, as this process saw them

    def perform(self, now: datetime) -> None:
        """Recover lapsed leases, add the outcome figures, run retention and the other shared duties.

        Raises what fails; the duties after it wait for the next beat.
        """
        self._recover(now)
        rollup.flush(self.alias, now)
        retention.run_if_due(self.alias, self.holder, now)
        unknown_names.run_if_due(self.alias, self.holder, now)
        releases.run_if_due(self.alias, self.holder, now)
        limit_pruning.run_if_due(self.alias, self.holder, now)

    def last_figures(self, now: datetime) -> None:
        """Add the outcomes written since the last beat, as the process stops."""
        rollup.flush(self.alias, now)

    def let_go(self, now: datetime) -> None:
        """At shutdown: free the retention lock if this process holds it with a backlog left."""
        retention.let_go(self.alias, self.holder, now)

    def _recover(self, now: datetime) -> None:
        recovered = recovery.recover_expired(self.alias, now, self.lapses)
        if recovered:
            self.recovered()
            # Recovered jobs, and the concurrency slots they held, are free for other processes too.
            announce(self.alias, "")
            job_signals.report_ended(self.alias, recovered)
