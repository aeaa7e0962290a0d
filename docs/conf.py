"""Sphinx configuration: MyST Markdown pages, the furo theme, and a reference generated from the code.

autodoc imports the package, whose models need a configured Django, so
this file sets Django up with the test settings on SQLite before anything
is documented. The build needs no network: there are no intersphinx
inventories, so references to Python's and Django's own objects are left
unresolved on purpose (``nitpick_ignore_regex``), while every reference to
vellum-jobs or to another page must resolve (``nitpicky``, and ``-W`` in
``make docs`` and on Read the Docs).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
# The settings module picks its database from this; SQLite needs no server.
os.environ["VELLUM_TEST_DB"] = "sqlite"
django.setup()

_metadata = importlib.metadata.metadata("vellum-jobs")
project = _metadata["Name"]
author = _metadata["Author"]
copyright = f"the {author}"
release = _metadata["Version"]
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "docs._ext.vellum_reference",
]

root_doc = "index"
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Quotes and dashes as typed: `'IMMEDIATE'` and `--workers` are meant to be copied.
smartquotes = False
# `[text](page.md#a-heading)` links to headings up to ###.
myst_heading_anchors = 3

nitpicky = True
# No inventories of other projects (the build is offline), so their objects
# cannot resolve: Python's standard library and Django.
nitpick_ignore_regex = [
    (r"py:.*", r"(datetime|collections\.abc|contextlib)(\..*)?"),
    (r"py:.*", r"django(\..*)?"),
    # django.tasks' Task cannot be subscripted at run time, so the Tasks
    # backend's annotations stay strings and show these bare names.
    (r"py:class", r"Task|TaskResult"),
    # The type variables of the generic JobFunction[P, R].
    (r"py:class", r"(vellum_jobs\.(enqueueing\.job_function|registry)\.)?(P|R)(\.args|\.kwargs)?"),
]
# The tutorial, how-to and explanation indexes list whatever pages their
# folders hold, which may be none (vellum_reference gives this warning its type).
suppress_warnings = ["toc.empty_glob"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
# django.tasks arrived in Django 6.0, which needs Python 3.12: on older
# Django the Tasks backend cannot import, so its section documents a stand-in.
if django.VERSION < (6, 0):
    autodoc_mock_imports = ["vellum_jobs.backends"]
    suppress_warnings.append("autodoc.mocked_object")

html_theme = "furo"
html_title = f"{project} {release}"
