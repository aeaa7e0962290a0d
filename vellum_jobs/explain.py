"""``explain()`` and its ``Reason``, at their documented path; they live in
``vellum_jobs.observe.explain``."""

from vellum_jobs.observe.explain import Reason, explain

__all__ = ["Reason", "explain"]
