"""``@job``, ``register`` and the ``JobFunction`` they return, at their documented path; they live
in ``vellum_jobs.enqueueing.registry``."""

from vellum_jobs.enqueueing.registry import (
    JobFunction,
    autodiscover,
    functions,
    get,
    job,
    register,
    unregister,
)

__all__ = ["JobFunction", "autodiscover", "functions", "get", "job", "register", "unregister"]
