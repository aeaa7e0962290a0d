"""``PartialIndex``: an index over only the rows a query looks for, where the database allows.

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
