"""``PartialIndex`` and ``PartialUniqueConstraint``: indexes over only the rows a query looks for.

The claim looks only at queued rows and the reaper only at running ones, a
small, hot minority of the table. A partial index holds just those rows: it
stays tiny however many finished jobs pile up, and a finished job costs it
nothing to maintain. MySQL and MariaDB have no partial indexes; there the
same columns are indexed over every row (still O(log n), with ``state``
leading). Django's own ``Index(condition=...)`` would be skipped there, with
a system-check warning, instead.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.models import Q
from django.db.models.sql.query import Query


class PartialIndex(models.Index):
    def __init__(self, *, fields: list[str], name: str, where: Q) -> None:
        super().__init__(fields=fields, name=name)
        self.where = where

    def _get_condition_sql(self, model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor) -> Any:
        if not schema_editor.connection.features.supports_partial_indexes:
            return None
        self.condition = self.where
        try:
            return super()._get_condition_sql(model, schema_editor)  # type: ignore[misc]
        finally:
            self.condition = None

    def deconstruct(self) -> Any:
        path, args, kwargs = super().deconstruct()
        kwargs["where"] = self.where
        return path, args, kwargs


class PartialUniqueConstraint(models.UniqueConstraint):
    """A unique index over only the rows ``where`` selects, on every vendor.

    PostgreSQL and SQLite get a partial unique index. MySQL and MariaDB have
    none, so there each field gets a virtual generated column that holds its
    value only while ``where`` is true (NULL otherwise), with a unique index
    over those columns: NULLs never collide, so only the selected rows are
    constrained. The index is the same rule, enforced by the same database.
    """

    def __init__(self, *, fields: list[str], name: str, where: Q) -> None:
        super().__init__(fields=fields, name=name, condition=where)

    def check(self, model: type[models.Model], connection: Any) -> list[Any]:
        # Django warns that MySQL cannot have conditional unique constraints;
        # this one can (see the class docstring).
        return [e for e in super().check(model, connection) if getattr(e, "id", None) != "models.W036"]

    def constraint_sql(
        self, model: type[models.Model] | None, schema_editor: BaseDatabaseSchemaEditor | None
    ) -> Any:
        assert model is not None and schema_editor is not None
        if schema_editor.connection.features.supports_partial_indexes:
            return super().constraint_sql(model, schema_editor)
        # Inside CREATE TABLE: add the columns and the index once the table exists.
        schema_editor.deferred_sql.append(self.create_sql(model, schema_editor))
        return None

    def create_sql(
        self, model: type[models.Model] | None, schema_editor: BaseDatabaseSchemaEditor | None
    ) -> Any:
        assert model is not None and schema_editor is not None
        if schema_editor.connection.features.supports_partial_indexes:
            return super().create_sql(model, schema_editor)
        quote = schema_editor.quote_name
        condition = self._literal_condition(model, schema_editor)
        columns = []
        for name in self.fields:
            field = model._meta.get_field(name)
            column = quote(str(field.column))  # type: ignore[union-attr]
            db_type = field.db_type(schema_editor.connection)
            columns.append(
                f"ADD COLUMN {quote(self._generated(name))} {db_type} "
                f"AS (CASE WHEN {condition} THEN {column} END) VIRTUAL"
            )
        generated = ", ".join(quote(self._generated(name)) for name in self.fields)
        return (
            f"ALTER TABLE {quote(model._meta.db_table)} {', '.join(columns)}, "
            f"ADD UNIQUE INDEX {quote(self.name)} ({generated})"
        )

    def remove_sql(
        self, model: type[models.Model] | None, schema_editor: BaseDatabaseSchemaEditor | None
    ) -> Any:
        assert model is not None and schema_editor is not None
        if schema_editor.connection.features.supports_partial_indexes:
            return super().remove_sql(model, schema_editor)
        quote = schema_editor.quote_name
        drops = ", ".join(f"DROP COLUMN {quote(self._generated(name))}" for name in self.fields)
        return f"ALTER TABLE {quote(model._meta.db_table)} DROP INDEX {quote(self.name)}, {drops}"

    def _generated(self, field: str) -> str:
        return f"{self.name}_{field}"

    def _literal_condition(self, model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor) -> str:
        """The condition as SQL with its values inlined (a generated column takes no parameters)."""
        query = Query(model=model, alias_cols=False)
        assert self.condition is not None
        where = query.build_where(self.condition)
        compiler = query.get_compiler(connection=schema_editor.connection)
        sql, params = where.as_sql(compiler, schema_editor.connection)
        return str(sql % tuple(schema_editor.quote_value(p) for p in params))

    def deconstruct(self) -> Any:
        path, args, kwargs = super().deconstruct()
        kwargs["where"] = kwargs.pop("condition")
        return path, args, kwargs
