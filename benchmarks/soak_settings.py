"""The soak run's settings: the benchmark settings with short leases, so killed workers' jobs return soon."""

from __future__ import annotations

from benchmarks.settings import *  # noqa: F403

VELLUM_JOBS = {"LEASE": 4, "HEARTBEAT": 1, "POLL_INTERVAL": 0.5}
