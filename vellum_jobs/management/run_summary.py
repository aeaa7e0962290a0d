"""What a finite ``runjobs`` (``--burst``, ``--max-jobs``) ran, counted by job name and outcome."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

from vellum_jobs.core.models import Job
from vellum_jobs.execution import outcome_text
from vellum_jobs.execution.outcome import Outcome


class RunSummary:
    """Counts of finished attempts by job name and kind of outcome; threads may add at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def add(self, job: Job, outcome: Outcome) -> None:
        with self._lock:
            self._counts[job.name][outcome_text.kind(outcome)] += 1

    def text(self) -> str:
        """``Ran 12 jobs: mail.send 10 done, 2 failed; report.build 1 done.``"""
        with self._lock:
            counts = {name: Counter(kinds) for name, kinds in self._counts.items()}
        total = sum(sum(kinds.values()) for kinds in counts.values())
        if not total:
            return "Ran no job."
        order = list(outcome_text.KIND_WORDS)
        parts = []
        for name in sorted(counts):
            kinds = sorted(counts[name].items(), key=lambda item: order.index(item[0]))
            parts.append(f"{name} " + ", ".join(f"{n} {outcome_text.KIND_WORDS[k]}" for k, n in kinds))
        return f"Ran {total} job{'s' if total != 1 else ''}: {'; '.join(parts)}."
