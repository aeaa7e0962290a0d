"""The README's Quickstart, followed as written in a new project, in subprocesses as a reader would.

The rule that reads it, from ``## Quickstart`` in README.md to the next ``## `` heading:

1. ``django-admin startproject mysite`` makes the project.
2. A ```python block whose first line is a comment naming a file, ``# <path>``, is that file
   (anything after the name on that line is ignored); all are written first, in order:

   - ``# settings.py`` or ``# urls.py`` is the project's own (``mysite/``), and the block is
     appended to it; there ``NAME = [..., a, b]`` means the project's ``NAME`` with ``a`` and
     ``b`` added, each once;
   - ``# <app>/<file>.py`` is written to that path. An app folder that is missing is made by
     ``manage.py startapp <app>`` and added to ``INSTALLED_APPS``: the quickstart puts jobs in
     "any installed app".

3. Each ``$ python manage.py ...`` line of a ```console block runs, in order, but ``runjobs``.
4. The first other ```python block that calls ``.enqueue(`` runs in ``manage.py shell -c`` up to
   and including that statement, after ``from <app>.jobs import *`` for each ``jobs.py`` written.
   Other ```python blocks are not run here (tests/documentation/test_docs_examples.py runs them).
5. The ```console line ``$ python manage.py runjobs ... --burst ...`` runs as written; then every
   job in the project's database must have ended ``done``.

Skip comments do not matter here: a file the docs' examples skip is still a file.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from tests.support.docs_examples import ROOT

FENCE = re.compile(r"^```(?P<language>\w*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
FILE_COMMENT = re.compile(r"#\s*(?P<path>[\w./-]+\.py)\b")
PROJECT_FILES = ("settings.py", "urls.py")


@dataclass(frozen=True)
class Quickstart:
    files: list[tuple[str, str]]  # (path, block), in the README's order
    commands: list[list[str]]  # manage.py arguments, runjobs aside
    enqueue: str  # the shell code up to the first enqueue
    runjobs: list[str]  # the runjobs --burst line's arguments


SECTION = re.compile(r"^## Quickstart[ \t]*\n(?P<body>.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)


def quickstart_section(readme: str) -> str:
    section = SECTION.search(readme)
    assert section, "README.md has no `## Quickstart` section"
    return section["body"]


def manage_py_lines(body: str) -> list[list[str]]:
    """The ``manage.py`` arguments of each ``$ python manage.py ...`` line, its comment dropped."""
    lines = []
    for line in body.splitlines():
        if line.startswith("$ python manage.py "):
            lines.append(shlex.split(line, comments=True)[3:])
    return lines


def up_to_first_enqueue(block: str) -> str | None:
    """The block's statements up to and including the first that calls ``.enqueue(``; None if none does."""
    for statement in ast.parse(block).body:
        calls = (node for node in ast.walk(statement) if isinstance(node, ast.Call))
        if any(isinstance(call.func, ast.Attribute) and call.func.attr == "enqueue" for call in calls):
            assert statement.end_lineno is not None
            return "\n".join(block.splitlines()[: statement.end_lineno])
    return None


def read_quickstart(readme: str) -> Quickstart:
    files: list[tuple[str, str]] = []
    commands: list[list[str]] = []
    runjobs: list[str] = []
    enqueue: str | None = None
    for fence in FENCE.finditer(quickstart_section(readme)):
        language, body = fence["language"], fence["body"]
        if language == "console":
            for arguments in manage_py_lines(body):
                if arguments[0] != "runjobs":
                    commands.append(arguments)
                elif "--burst" in arguments and not runjobs:
                    runjobs = arguments
        elif language == "python":
            named = FILE_COMMENT.match(body.splitlines()[0])
            if named:
                files.append((named["path"], body))
            elif enqueue is None:
                enqueue = up_to_first_enqueue(body)
    assert files, "the Quickstart names no file (a ```python block whose first line is `# <path>`)"
    assert enqueue, "no ```python block of the Quickstart calls .enqueue("
    assert runjobs, "no ```console line of the Quickstart runs `python manage.py runjobs ... --burst`"
    return Quickstart(files, commands, enqueue, runjobs)


def added_to_project(block: str) -> str:
    """A block to append to a project file: ``NAME = [..., a]`` becomes the file's NAME plus ``a``."""
    module = ast.parse(block)
    for statement in module.body:
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and isinstance(statement.value, ast.List | ast.Tuple)
            and statement.value.elts
            and isinstance(statement.value.elts[0], ast.Constant)
            and statement.value.elts[0].value is Ellipsis
        ):
            name = statement.targets[0].id
            entries = ast.unparse(ast.List(elts=statement.value.elts[1:]))
            statement.value = ast.parse(f"list(dict.fromkeys([*{name}, *{entries}]))", mode="eval").body
    return "\n" + ast.unparse(module) + "\n"


class Project:
    """A new project made by ``startproject``, driven through its ``manage.py``."""

    def __init__(self, folder: Path):
        self.folder = folder
        # pytest-django exported the test settings; the project's manage.py
        # must pick its own.
        self.env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        # In the folder itself: Django 5.2 makes a project only in a folder that
        # exists, and one beside the new folder would see it as a module "mysite".
        folder.mkdir(parents=True)
        run([sys.executable, "-m", "django", "startproject", "mysite", "."], folder, self.env)

    def manage(self, *arguments: str) -> str:
        return run([sys.executable, "manage.py", *arguments], self.folder, self.env)

    def write(self, path: str, block: str) -> None:
        if path in PROJECT_FILES:
            with (self.folder / "mysite" / path).open("a") as file:
                file.write(added_to_project(block))
            return
        target = self.folder / path
        app = Path(path).parts[0]
        if len(Path(path).parts) > 1 and not (self.folder / app).exists():
            self.manage("startapp", app)
            self.write("settings.py", f"INSTALLED_APPS = [..., {app!r}]")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block)


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.fail(
            f"README Quickstart: `{shlex.join(command[1:])}` exited {done.returncode}\n"
            f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}",
            pytrace=False,
        )
    return done.stdout


def follow(quickstart: Quickstart, folder: Path, *, debug: bool = True) -> list[tuple[str, str, str]]:
    """Make the project, do what the quickstart says, and return its jobs' names, states and errors.

    ``debug=False`` runs it as deployed: Django then logs no queries, and
    the enqueue takes the path a production web request takes.
    """
    project = Project(folder)
    for path, block in quickstart.files:
        project.write(path, block)
    if not debug:
        project.write("settings.py", "DEBUG = False\nALLOWED_HOSTS = ['localhost']")
    for arguments in quickstart.commands:
        project.manage(*arguments)
    apps = sorted({Path(path).parts[0] for path, _ in quickstart.files if path.endswith("/jobs.py")})
    imports = "".join(f"from {app}.jobs import *\n" for app in apps)
    project.manage("shell", "-c", imports + quickstart.enqueue)
    project.manage(*quickstart.runjobs)
    jobs = project.manage(
        "shell",
        "-c",
        "import json\nfrom vellum_jobs.core.models import Job\n"
        "print(json.dumps(list(Job.objects.values_list('name', 'state', 'error'))))",
    )
    return [tuple(job) for job in json.loads(jobs.splitlines()[-1])]


# Slow: a new project and several manage.py processes. `make test` runs it in the
# Python 3.11 SQLite cell, the bare install's (tests/conftest.py shares tests/system/ there).
@pytest.mark.slow
@pytest.mark.skipif(connection.vendor != "sqlite", reason="the new project is on SQLite; once is enough")
@pytest.mark.parametrize("debug", [True, False], ids=["DEBUG=True", "DEBUG=False"])
def test_the_readme_quickstart_runs_a_job_to_done_in_a_new_project(tmp_path: Path, debug: bool):
    jobs = follow(read_quickstart((ROOT / "README.md").read_text()), tmp_path / "mysite", debug=debug)
    assert jobs, "the Quickstart's enqueue made no job"
    assert all(state == "done" for _, state, _ in jobs), jobs


def test_the_rule_reads_files_commands_the_enqueue_and_the_burst():
    readme = """\
## Quickstart

```python
# settings.py
INSTALLED_APPS = [..., "vellum_jobs"]
```

```console
$ python manage.py migrate    # the tables
$ python manage.py runjobs    # until SIGTERM
$ python manage.py runjobs --burst   # until none is due
```

```python
# library/jobs.py
from vellum_jobs import job
```

```python
from datetime import timedelta

ping(1)
job = ping.using(
    delay=timedelta(0)).enqueue(2)
ping.enqueue(3)
```

## Next
```console
$ python manage.py flush
```
"""
    quickstart = read_quickstart(readme)
    assert [path for path, _ in quickstart.files] == ["settings.py", "library/jobs.py"]
    assert quickstart.commands == [["migrate"]]
    assert quickstart.runjobs == ["runjobs", "--burst"]
    assert quickstart.enqueue.splitlines()[-2:] == ["job = ping.using(", "    delay=timedelta(0)).enqueue(2)"]


def test_a_list_written_with_an_ellipsis_adds_to_the_project_s_list():
    namespace: dict[str, object] = {"INSTALLED_APPS": ["django.contrib.admin", "django.contrib.contenttypes"]}
    exec(added_to_project('INSTALLED_APPS = [..., "django.contrib.contenttypes", "vellum_jobs"]'), namespace)
    apps = ["django.contrib.admin", "django.contrib.contenttypes", "vellum_jobs"]
    assert namespace["INSTALLED_APPS"] == apps
