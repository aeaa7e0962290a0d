"""Quoted identifiers of the jobs, queues and locks tables, from the models' ``_meta``, never typed."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.core.models import Job, MaintenanceLock, Queue

# The columns a worker needs to run a job, in model order. The claim's own
# values (state, worker, lease, start) are known from the request; the rest
# load lazily if a handler asks. The unique key tells whether putting the
# job back in the queue may collide with another job's (``putback``).
# A workflow's step says so, for the release after its end (``core.dependencies``),
# and what of its upstream jobs' it is handed.
RETURNED = [
    f
    for f in Job._meta.concrete_fields
    if f.attname
    in {"id", "name", "queue", "priority", "args", "kwargs", "attempts", "max_attempts", "timeout",
        "run_after", "ref_type_id", "ref_id", "trace_context", "concurrency_key", "concurrency_limit",
        "claims", "is_async", "unique_key", "workflow_id", "upstream_arg", "limits"}
]  # fmt: skip


class Names(dict[str, str]):
    """Quoted column names by attname, plus ``table``, ``returned`` and the queue and lock tables' names."""


@lru_cache(maxsize=8)
def _quoted(vendor: str, quote: Callable[[str], str]) -> Names:
    names = Names({f.attname: quote(str(f.column)) for f in Job._meta.concrete_fields})
    names["table"] = quote(Job._meta.db_table)
    names["returned"] = ", ".join(quote(str(f.column)) for f in RETURNED)
    names["queue_table"] = quote(Queue._meta.db_table)
    names["queue_name"] = quote(str(Queue._meta.get_field("name").column))
    names["queue_paused_at"] = quote(str(Queue._meta.get_field("paused_at").column))
    names["lock_table"] = quote(MaintenanceLock._meta.db_table)
    names["lock_name"] = quote(str(MaintenanceLock._meta.get_field("name").column))
    return names


def names(connection: BaseDatabaseWrapper) -> Names:
    return _quoted(connection.vendor, connection.ops.quote_name)


def columns(connection: BaseDatabaseWrapper, table: str = "") -> dict[str, str]:
    """Quoted column names by attname, each prefixed with ``table.`` if given."""
    prefix = f"{table}." if table else ""
    quote = connection.ops.quote_name
    return {f.attname: prefix + quote(str(f.column)) for f in Job._meta.concrete_fields}


def channel() -> str:
    """The LISTEN/NOTIFY channel that wakes idle workers: the jobs table's name."""
    return Job._meta.db_table
