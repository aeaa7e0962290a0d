"""The sustained-load run's settings: the benchmark settings with short retention and kept connections.

Finished jobs are kept two minutes (failed ones five), so the table reaches
its steady size within a 20-minute run: the workers prune on their
heartbeat, one process at a time, at most once every five minutes
(``vellum_jobs.maintenance.retention.INTERVAL``). Connections are kept, as
the production checklist advises.
"""

from __future__ import annotations

from benchmarks.settings import *  # noqa: F403
from benchmarks.settings import DATABASES

RETENTION = {"done": "2m", "failed": "5m", "cancelled": "2m"}
VELLUM_JOBS = {"RETENTION": RETENTION}
DATABASES["default"]["CONN_MAX_AGE"] = 600
