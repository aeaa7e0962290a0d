"""The Sphinx side of the generated reference: directives that render ``reference``, and autodoc hooks.

Each directive parses the Markdown its function returns as if it were
written in the page, headings included, and makes the page depend on the
package's source, so an incremental build re-reads it when the code
changes. Something the code has and the reference does not describe is a
warning, which ``-W`` makes an error.

autodoc needs two hints about Django: a model's fields are documented by
the ``vellum-model-fields`` table, not as class attributes, and a
module-level object documented by a ``#`` comment above it (the signals)
takes that comment instead of its class's docstring.
"""

from __future__ import annotations

import importlib
import inspect
import logging as logging_std
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from django.db import models
from django.db.models.query_utils import DeferredAttribute
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.typing import ExtensionMetadata

from docs._ext import reference
from docs._ext.reference import actions, checks, commands, fields, settings, states
from docs._ext.reference.markdown import comments_above

logger = logging.getLogger(__name__)


class GeneratedMarkdown(SphinxDirective):
    """Parses the Markdown ``render`` returns into the page."""

    render: ClassVar[Callable[..., str]]

    def markdown(self) -> str:
        return type(self).render()

    def run(self) -> list[nodes.Node]:
        for path in [*reference.PACKAGE.rglob("*.py"), *Path(reference.__file__).parent.glob("*.py")]:
            self.env.note_dependency(str(path))
        try:
            text = self.markdown()
        except reference.Incomplete as exc:
            logger.warning("the reference is incomplete: %s", exc, location=self.get_location())
            return []
        container = nodes.section()
        container.document = self.state.document
        lines = StringList(text.splitlines(), source=self.name)
        self.state.nested_parse(lines, 0, container, match_titles=True)
        return list(container.children)


class Settings(GeneratedMarkdown):
    render = settings.settings_markdown


class Commands(GeneratedMarkdown):
    render = commands.commands_markdown


class Checks(GeneratedMarkdown):
    render = checks.checks_markdown


class States(GeneratedMarkdown):
    render = states.states_markdown


class AdminActions(GeneratedMarkdown):
    render = actions.admin_actions_markdown


class ModelFields(GeneratedMarkdown):
    """The fields of the model named by the argument, such as ``vellum_jobs.core.models.Job``."""

    required_arguments = 1

    def markdown(self) -> str:
        module, _, name = self.arguments[0].rpartition(".")
        model = getattr(importlib.import_module(module), name)
        return fields.fields_markdown(model)


def skip_django_internals(
    app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: dict[str, Any]
) -> bool | None:
    """Leave out what Django adds to a model class: field descriptors, managers, ``DoesNotExist``..."""
    if isinstance(obj, (DeferredAttribute, models.Manager)) or type(obj).__module__.startswith(
        "django.db.models.fields"
    ):
        return True
    # Model.DoesNotExist and its kin, which Django's ModelBase makes for each model.
    if inspect.isclass(obj) and issubclass(obj, Exception) and what == "class":
        return any(base.__module__.startswith("django.") for base in obj.__bases__) or None
    return None


def comment_as_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """A module-level object with a ``#`` comment above it is documented by the comment."""
    if what != "data":
        return
    module_name, _, attribute = name.rpartition(".")
    try:
        source = inspect.getsource(importlib.import_module(module_name))
    except (ImportError, OSError, TypeError):
        return
    comment = comments_above(source).get(attribute)
    if comment:
        lines[:] = [comment, ""]


class EmptyGlobType(logging_std.Filter):
    """Gives the "toctree glob pattern didn't match" warning its documented type, ``toc.empty_glob``.

    Sphinx logs it with a subtype and no type, and ``suppress_warnings``
    only matches warnings that have a type.
    """

    def filter(self, record: logging_std.LogRecord) -> bool:
        if getattr(record, "subtype", None) == "empty_glob" and getattr(record, "type", None) is None:
            record.type = "toc"
        return True


def setup(app: Sphinx) -> ExtensionMetadata:
    logging_std.getLogger("sphinx.sphinx.directives.other").addFilter(EmptyGlobType())
    app.add_directive("vellum-settings", Settings)
    app.add_directive("vellum-commands", Commands)
    app.add_directive("vellum-checks", Checks)
    app.add_directive("vellum-states", States)
    app.add_directive("vellum-admin-actions", AdminActions)
    app.add_directive("vellum-model-fields", ModelFields)
    app.connect("autodoc-skip-member", skip_django_internals)
    app.connect("autodoc-process-docstring", comment_as_docstring)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
