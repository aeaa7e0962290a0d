"""A big jobs table, fast: the tests of query plans need tens of thousands of rows, not their objects.

A few hundred rows go in through the ORM, as an application writes them;
the database then copies them (``INSERT ... SELECT``) until there are enough,
doubling each time, which costs a handful of statements instead of building
and sending 20,000 ``Job`` objects.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from vellum_jobs.core.models import Job

SEED = 500


def fill(count: int, name: str = "test.add", **fields: Any) -> None:
    """Add ``count`` jobs named ``name`` with ``fields`` (e.g. ``state="done"``); copies of
    the jobs of that name already in the table may be among them."""
    seed = min(count, SEED)
    Job.objects.bulk_create(Job(name=name, **fields) for _ in range(seed))
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    columns = ", ".join(quote(str(f.column)) for f in Job._meta.concrete_fields if not f.primary_key)
    added = seed
    with connection.cursor() as cursor:
        while added < count:
            more = min(added, count - added)
            # MySQL copies the rows it selects from the table it inserts into through a temporary
            # table; the others read a snapshot. Either way only rows that existed are copied.
            cursor.execute(
                f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {table}"
                f" WHERE {quote('name')} = %s LIMIT {more}",
                [name],
            )
            added += more
