"""The fenced write: one conditional UPDATE that applies only while a claim still holds a job.

Every write after the claim goes through here. The WHERE clause is the
fence of ``transitions``: the job's id, state ``running`` and the claim's
token (the never-reset claim counter), plus any column the transition needs
still NULL. A worker whose lease lapsed (and whose job was recovered,
retried or claimed again since) updates zero rows. The statements are raw
SQL because they run once per job: building them through the ORM cost more
than running them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.core import history, transitions
from vellum_jobs.core.models import Job
from vellum_jobs.core.transitions import Add
from vellum_jobs.store import db, sql
from vellum_jobs.store.sql.names import columns, names


def update_if_held(job: Job, token: int, changes: Mapping[str, Any], nulls: Sequence[str] = ()) -> bool:
    """Apply ``changes`` to ``job``'s row if the claim ``token`` still holds it; True if it did."""
    connection = connections[job._state.db or "default"]
    fields = tuple(changes)
    key = (connection.vendor, fields, kinds(changes), tuple(nulls))
    sql = _statements.get(key) or _statements.setdefault(key, _statement(connection, changes, tuple(nulls)))
    params = set_params(connection, changes) + transitions.fence_values(job.pk, token)
    return bool(db.execute(connection, sql, params).rowcount)


def set_sql(connection: BaseDatabaseWrapper, changes: Mapping[str, Any], table: str = "") -> str:
    """The SET list for ``changes`` (``column = %s``, or ``column = column + %s`` for an ``Add``)."""
    quote = connection.ops.quote_name
    prefix = f"{table}." if table else ""
    sets = []
    for name, value in changes.items():
        column = quote(str(_FIELDS[name].column))
        sets.append(_assignment(connection, column, prefix + column, value, "%s"))
    return ", ".join(sets)


def _assignment(connection: BaseDatabaseWrapper, column: str, current: str, value: Any, new: str) -> str:
    """``column = new``, or ``current + new`` for an ``Add``, or ``new`` appended to ``current``."""
    if isinstance(value, Add):
        return f"{column} = {current} + {new}"
    if isinstance(value, history.Append):
        return f"{column} = {history.append_sql(connection, current, new)}"
    return f"{column} = {new}"


def set_params(connection: BaseDatabaseWrapper, changes: Mapping[str, Any]) -> list[Any]:
    return [_prep(connection, name, value) for name, value in changes.items()]


def kinds(changes: Mapping[str, Any]) -> tuple[str, ...]:
    """How each change is written (a value, an ``Add``, an ``Append``): what its SQL depends on."""
    return tuple(
        type(value).__name__ if isinstance(value, Add | history.Append) else "" for value in changes.values()
    )


def _prep(connection: BaseDatabaseWrapper, name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, Add):
        return value.n
    if isinstance(value, history.Append):
        return value.json()
    if name in _DATETIMES:
        # What get_db_prep_save ends in, without its checks for expressions
        # and naive values: the worker only writes timezone.now() here.
        return connection.ops.adapt_datetimefield_value(value)
    if name in _TEXTS and isinstance(value, str):
        return value  # what a text column's get_db_prep_save returns for a str, at a fraction of the cost
    return _FIELDS[name].get_db_prep_save(value, connection)


_FIELDS = {f.attname: f for f in Job._meta.concrete_fields}
_DATETIMES = {name for name, f in _FIELDS.items() if f.get_internal_type() == "DateTimeField"}
_TEXTS = {name for name, f in _FIELDS.items() if f.get_internal_type() in ("CharField", "TextField")}
_statements: dict[tuple[Any, ...], str] = {}


def _fence_sql(column: Mapping[str, str], nulls: Sequence[str]) -> str:
    """``id = %s AND state = %s AND claims = %s``, and ``c IS NULL`` for each of ``nulls``."""
    terms = [f"{column[name]} = %s" for name in transitions.FENCE]
    terms += [f"{column[name]} IS NULL" for name in nulls]
    return " AND ".join(terms)


def _statement(connection: BaseDatabaseWrapper, changes: Mapping[str, Any], nulls: tuple[str, ...]) -> str:
    table = connection.ops.quote_name(Job._meta.db_table)
    where = _fence_sql(columns(connection), nulls)
    return db.driver_sql(connection, f"UPDATE {table} SET {set_sql(connection, changes)} WHERE {where}")


def update_all_if_held(
    held: Sequence[tuple[Job, int]], changes: Sequence[Mapping[str, Any]], nulls: Sequence[str] = ()
) -> set[int]:
    """``update_if_held`` for several (job, token) pairs whose changes name the same columns, at once.

    Returns the ids of the rows it updated; each row is fenced on its own
    token, exactly as ``update_if_held`` would. The statement joins the
    table to a VALUES list of (id, token, new values...): one round trip
    instead of one per job, the larger part of a short job's cost on
    PostgreSQL. SQLite and PostgreSQL only (MySQL cannot say which rows an
    UPDATE touched).
    """
    connection = connections[held[0][0]._state.db or "default"]
    statement, params = joined(held, changes, nulls)
    return {row[0] for row in db.execute(connection, statement, params).fetchall()}


def joined(
    held: Sequence[tuple[Job, int]], changes: Sequence[Mapping[str, Any]], nulls: Sequence[str] = ()
) -> tuple[str, list[Any]]:
    """``update_all_if_held``'s statement, which returns the ids it updated, and its parameters, unrun."""
    connection = connections[held[0][0]._state.db or "default"]
    by_column = sql.of(connection).joins_columns
    first = changes[0]
    rows = 0 if by_column else len(held)  # a statement for any number of rows, or for this one
    key = (connection.vendor, tuple(first), kinds(first), tuple(nulls), rows)
    statement = _statements.get(key) or _statements.setdefault(
        key, _joined(connection, first, tuple(nulls), rows)
    )
    values: list[list[Any]] = []
    prepared: dict[tuple[str, int], Any] = {}  # rows of a batch share most values (state, now, None)
    for (job, token), row in zip(held, changes, strict=True):
        values.append([job.id, token])
        for name, value in row.items():
            seen = (name, id(value))
            if seen not in prepared:
                prepared[seen] = _prep(connection, name, value)
            values[-1].append(prepared[seen])
    params: list[Any]
    if by_column:
        params = [list(column) for column in zip(*values, strict=True)]
    else:
        params = [value for row_values in values for value in row_values]
    params.append(transitions.RUNNING)
    return statement, params


def _joined(
    connection: BaseDatabaseWrapper, changes: Mapping[str, Any], nulls: tuple[str, ...], rows: int
) -> str:
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    column = columns(connection, table)
    fields = tuple(changes)
    sets = [
        _assignment(connection, quote(str(_FIELDS[name].column)), column[name], changes[name], f"v.new_{i}")
        for i, name in enumerate(fields)
    ]
    types = [str(_FIELDS[name].db_type(connection)) for name in ("id", "claims", *fields)]
    head = sql.of(connection).update_joined(names(connection), sets, types, rows)
    id_, state, token = transitions.FENCE
    where = [f"{column[id_]} = v.fence_id", f"{column[state]} = %s", f"{column[token]} = v.fence_token"]
    where += [f"{column[name]} IS NULL" for name in nulls]
    return db.driver_sql(connection, f"{head} WHERE {' AND '.join(where)} RETURNING {column['id']}")


def renew_leases(
    connection: BaseDatabaseWrapper, worker_id: uuid.UUID, job_ids: list[int], until: Any
) -> int:
    """Extend the leases ``worker_id`` still holds on ``job_ids``; returns how many it extended.

    The dispatcher may be writing some of these rows' outcomes at this very
    moment. Waiting for those row locks invites a deadlock (two multi-row
    writers locking in different orders), and they need no renewal anyway:
    PostgreSQL skips locked rows; MySQL takes its locks in id order, the
    order outcomes are written in.
    """
    column = columns(connection)
    held = " AND ".join(f"{column[name]} = %s" for name in transitions.RENEWAL)
    params = [
        _prep(connection, name, value)
        for name, value in zip(transitions.RENEWAL, transitions.renewal_values(worker_id), strict=True)
    ]
    ((name, value),) = transitions.renewed(until).items()
    statement, ids = sql.of(connection).renew(connection, job_ids, f"{column[name]} = %s", held)
    params = [_prep(connection, name, value), *ids, *params]
    return int(db.execute(connection, db.driver_sql(connection, statement), params).rowcount)
