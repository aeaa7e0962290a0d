"""``@job``, ``register`` and the ``JobFunction`` they return, at their documented path; they live
in ``vellum_jobs.enqueueing.job_function``."""

from vellum_jobs.enqueueing.job_function import (
    JobFunction,
    autodiscover,
    functions,
    get,
    job,
    register,
    unregister,
)

__all__ = ["JobFunction", "autodiscover", "functions", "get", "job", "register", "unregister"]
