"""A model's columns as a table: type, default, and its help text or the comment above it in the source."""

from __future__ import annotations

import enum
import inspect
from typing import Any

from django.db import models

from docs._ext.reference.markdown import code, comments_above, escape, from_rst, table


def _field_type(field: models.Field[Any, Any]) -> str:
    kind = type(field).__name__
    if isinstance(field, models.CharField) and field.max_length:
        kind += f"({field.max_length})"
    if isinstance(field, models.ForeignKey) and not isinstance(field.related_model, str):
        kind += f" to {field.related_model._meta.label}"
    return kind + (", null" if field.null else "")


def _field_default(field: models.Field[Any, Any]) -> str:
    if field.primary_key or not field.has_default():
        return "—"
    default = field.default
    if isinstance(default, enum.Enum):
        return code(repr(default.value))
    if callable(default):
        module = getattr(default, "__module__", "builtins")
        name = getattr(default, "__qualname__", repr(default))
        return code(name if module == "builtins" else f"{module.rsplit('.', 1)[-1]}.{name}")
    return code(repr(default))


def fields_markdown(model: type[models.Model]) -> str:
    """A table of the model's concrete fields: type, default, and its help text or the comment above it."""
    comments = comments_above(inspect.getsource(model))
    rows = []
    for field in model._meta.concrete_fields:
        description = escape(str(field.help_text)) or from_rst(comments.get(field.name, ""))
        rows.append((code(field.name), escape(_field_type(field)), _field_default(field), description))
    return table(("field", "type", "default", "description"), rows)
