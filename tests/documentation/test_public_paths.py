"""Every import path the documentation gives keeps working, whichever package its code lives in.

The paths are read from the documentation itself: each Sphinx directive of
the API reference and each ``from vellum_jobs... import ...`` a page shows a
reader. The ones Django and the migrations rely on are named here too.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import django
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DIRECTIVE = re.compile(r"^\.\. auto(?:class|function|exception|data|module)::\s+(vellum_jobs[\w.]*)", re.M)
FROM_IMPORT = re.compile(r"^\s*from (vellum_jobs[\w.]*) import ([\w, ]+)$", re.M)

# Paths no page shows, that Django, the migrations or a project's settings need.
NEEDED = [
    "vellum_jobs.models.Job",  # Django imports the app's models module
    "vellum_jobs.models.Worker",
    "vellum_jobs.models.Queue",
    "vellum_jobs.indexes.PartialIndex",  # migrations 0001-0010 import it
    "vellum_jobs.indexes.PartialUniqueConstraint",
    "vellum_jobs.urls.urlpatterns",  # include("vellum_jobs.urls")
    "vellum_jobs.pytest_plugin",  # the pytest11 entry point
    "vellum_jobs.registry.job",
    "vellum_jobs.explain.explain",
    "vellum_jobs.queues.pause",
    "vellum_jobs.queues.resume",
]
# The Tasks backend needs django.tasks, new in Django 6.0.
NEEDS_DJANGO_6 = ("vellum_jobs.backends",)


def documented() -> set[str]:
    paths: set[str] = set()
    for page in PAGES:
        text = page.read_text()
        paths.update(DIRECTIVE.findall(text))
        for module, names in FROM_IMPORT.findall(text):
            paths.update(f"{module}.{name.strip()}" for name in names.split(",") if name.strip())
    return paths


def resolve(path: str) -> object:
    """The object at a dotted ``path`` as ``from a.b import c`` finds it: an attribute of the
    module if it has one (``vellum_jobs.enqueueing`` is the function), else the submodule."""
    first, *rest = path.split(".")
    found: object = importlib.import_module(first)
    for part in rest:
        if hasattr(found, part):
            found = getattr(found, part)
        else:
            found = importlib.import_module(f"{found.__name__}.{part}")  # type: ignore[attr-defined]
    return found


def test_the_documentation_shows_import_paths():
    """The parse below finds what it is for: a change to the pages' form cannot empty the list."""
    paths = documented()
    assert {"vellum_jobs.models.Job", "vellum_jobs.registry.JobFunction", "vellum_jobs.queues"} <= paths


@pytest.mark.parametrize("path", sorted(documented() | set(NEEDED)))
def test_a_documented_path_imports(path):
    if path.startswith(NEEDS_DJANGO_6) and django.VERSION < (6, 0):
        pytest.skip("django.tasks is new in Django 6.0")
    assert resolve(path) is not None


@pytest.mark.parametrize(
    ("public", "home"),
    [
        ("vellum_jobs.models.Job", "vellum_jobs.core.models.Job"),
        ("vellum_jobs.indexes.PartialIndex", "vellum_jobs.core.indexes.PartialIndex"),
        ("vellum_jobs.registry.JobFunction", "vellum_jobs.enqueueing.job_function.JobFunction"),
        ("vellum_jobs.explain.Reason", "vellum_jobs.observe.explain.Reason"),
        ("vellum_jobs.job", "vellum_jobs.enqueueing.job_function.job"),
    ],
)
def test_a_public_path_is_the_object_itself_not_a_copy(public, home):
    """isinstance checks, the admin's registrations and monkeypatching see one object."""
    assert resolve(public) is resolve(home)


def test_the_package_s_functions_are_not_shadowed_by_its_subpackages():
    """Importing a subpackage binds its name on the package: none may be named like a function
    of the public surface (``from vellum_jobs import enqueue`` is the function)."""
    import pkgutil

    import vellum_jobs

    modules = {module.name for module in pkgutil.iter_modules(vellum_jobs.__path__)}
    assert {"core", "worker", "models"} <= modules  # the listing works
    assert not modules & set(vellum_jobs.__all__)
    assert callable(vellum_jobs.enqueue) and callable(vellum_jobs.aenqueue)
