"""The admin's actions: where each is offered, what it does, and the permission it needs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from django.contrib import admin as django_admin

from docs._ext.reference.markdown import code, escape, table
from vellum_jobs import admin


def admin_actions() -> Iterator[tuple[type[django_admin.ModelAdmin[Any]], str, Callable[..., Any]]]:
    for name in admin.__all__:
        model_admin = getattr(admin, name)
        for action in model_admin.actions or ():
            yield model_admin, action.__name__, action


def admin_actions_markdown() -> str:
    """Every admin action: where it is offered, what it does, and the permission it needs."""
    rows = []
    for model_admin, name, action in admin_actions():
        description = getattr(action, "plural_description", None) or getattr(
            action, "short_description", name
        )
        model = model_admin.__name__.removesuffix("Admin")
        # Django 6.1 offers an action on the list, on an object's page, or both.
        places = [_PLACES.get(getattr(p, "name", ""), str(p)) for p in getattr(action, "locations", ())]
        needs = [f"*{p} {model.lower()}*" for p in getattr(action, "allowed_permissions", ())]
        where = f"{model} {' and '.join(places or ['list'])}"
        rows.append((where, code(name), escape(str(description)), ", ".join(needs) or "—"))
    return table(("where", "action", "what it does", "permission"), rows)


_PLACES = {"CHANGE_LIST": "list", "CHANGE_FORM": "page"}
