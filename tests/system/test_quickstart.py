"""The README's Quickstart and then the tutorial, followed as written in a new project, in subprocesses.

The rule that reads a page (the README's ``## Quickstart`` section, from its heading to the
next ``## ``; each page of the tutorial, in its table of contents' order), step by step in the
page's order:

1. ``django-admin startproject mysite`` makes the project; other lines that are not
   ``python ...`` (``pip``, ``cd``, ``git``) are the reader's and not run, but the tutorial's
   ``cp -r .../example_project/sample_media .``, which copies this checkout's.
2. A ```python block whose first line is a comment naming a file, ``# <path>``, is that file
   (anything after the name on that line is ignored), and so is a ```{literalinclude} of a
   whole file whose ``:caption:`` is the path:

   - ``# settings.py`` or ``# urls.py`` is the project's own (``mysite/``), and the block is
     appended to it; there ``NAME = [..., a, b]`` means the project's ``NAME`` with ``a`` and
     ``b`` added, each once;
   - ``# <app>/<file>.py`` is written to that path, in the app the page told to make.

3. Each ``$ python manage.py ...`` line of a ```console block runs, but ``runserver`` and
   ``createsuperuser`` (they wait for a person); ``runjobs`` runs with ``--burst``, so the
   worker runs every due job and exits. ``$ python -m pytest ...`` runs too. ``check``
   must print the line the page shows after it ("no issues", when the settings are right).
4. The README: the first other ```python block that calls ``.enqueue(`` runs in ``manage.py
   shell -c`` up to and including that statement. A tutorial page: its other ```python
   blocks, those a skip comment leaves out aside, run in order in one ``manage.py shell``
   after the page's other steps, as a reader types them; their asserts are the page's.
5. After the README, every job in the project's database must have ended ``done``.

Skip comments do not matter to files: a file the docs' examples skip is still a file. Other
```python blocks are not run here (tests/documentation/test_docs_examples.py runs them).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from tests.support.docs_examples import ROOT

FENCE = re.compile(
    r"^```(?P<language>\{literalinclude\}|\w*)(?P<argument>[^\n]*)\n(?P<body>.*?)^```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
FILE_COMMENT = re.compile(r"#\s*(?P<path>[\w./-]+\.py)\b")
SKIP_COMMENT = re.compile(r"(<!--|%)\s*skip: next\b")
PROJECT_FILES = ("settings.py", "urls.py")
# A literalinclude with one of these shows a part of the file, not a file to write.
PART_OPTIONS = (":start-at:", ":start-after:", ":end-at:", ":end-before:", ":pyobject:", ":lines:")
# Commands that wait for a person; the walk does not run them.
INTERACTIVE = ("runserver", "createsuperuser")
TUTORIAL = ROOT / "docs" / "tutorial"
SAMPLE_MEDIA = ROOT / "example_project" / "sample_media"


@dataclass(frozen=True)
class Step:
    """One thing a page tells the reader to do: write a file, run a command or a shell, copy the media."""

    kind: str  # "file", "command", "shell" or "copy"
    path: str = ""  # a file's
    text: str = ""  # a file's content, or the shell's code
    arguments: tuple[str, ...] = ()  # a command's, after `python`
    output: str = ""  # what a `check` prints, as the page shows it


SECTION = re.compile(r"^## Quickstart[ \t]*\n(?P<body>.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)


def quickstart_section(readme: str) -> str:
    section = SECTION.search(readme)
    assert section, "README.md has no `## Quickstart` section"
    return section["body"]


def console_steps(body: str) -> list[Step]:
    """The commands of a ```console block's ``$`` lines, their comments dropped."""
    steps = []
    lines = body.splitlines()
    for number, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        words = shlex.split(line[2:], comments=True)
        if words[:2] == ["python", "manage.py"]:
            arguments = words[1:]
            if arguments[1] in INTERACTIVE:
                continue
            if arguments[1] == "runjobs" and "--burst" not in arguments:
                arguments.append("--burst")
            # Only check's output is whole on the page; the others' is cut short ("...").
            shown = lines[number + 1 : number + 2] if arguments[1] == "check" else []
            output = shown[0] if shown and not shown[0].startswith("$ ") else ""
            steps.append(Step("command", arguments=tuple(arguments), output=output))
        elif words[:2] == ["python", "-m"]:
            steps.append(Step("command", arguments=tuple(words[1:])))
        elif words[:2] == ["cp", "-r"] and words[2].endswith("example_project/sample_media"):
            steps.append(Step("copy", path=words[3]))
    return steps


def file_step(language: str, argument: str, body: str, page: Path) -> Step | None:
    """The file a block is, if any: a ```python block named by its first line, or a whole literalinclude."""
    if language == "python":
        named = FILE_COMMENT.match(body.splitlines()[0])
        return Step("file", path=named["path"], text=body) if named else None
    options = body.splitlines()
    caption = [line.split(":", 2)[2].strip() for line in options if line.startswith(":caption:")]
    if not caption or any(line.startswith(PART_OPTIONS) for line in options):
        return None
    return Step("file", path=caption[0], text=(page.parent / argument.strip()).read_text())


def up_to_first_enqueue(block: str) -> str | None:
    """The block's statements up to and including the first that calls ``.enqueue(``; None if none does."""
    for statement in ast.parse(block).body:
        calls = (node for node in ast.walk(statement) if isinstance(node, ast.Call))
        if any(isinstance(call.func, ast.Attribute) and call.func.attr == "enqueue" for call in calls):
            assert statement.end_lineno is not None
            return "\n".join(block.splitlines()[: statement.end_lineno])
    return None


def read_quickstart(readme: str) -> list[Step]:
    steps: list[Step] = []
    enqueue: str | None = None
    for fence in FENCE.finditer(quickstart_section(readme)):
        language, body = fence["language"], fence["body"]
        if language == "console":
            steps.extend(console_steps(body))
        elif language == "python":
            file = file_step(language, fence["argument"], body, ROOT / "README.md")
            if file:
                steps.append(file)
            elif enqueue is None:
                enqueue = up_to_first_enqueue(body)
                if enqueue:
                    steps.append(Step("shell", text=enqueue))
    kinds = [step.kind for step in steps]
    assert "file" in kinds, "the Quickstart names no file (a ```python block whose first line is `# <path>`)"
    assert enqueue, "no ```python block of the Quickstart calls .enqueue("
    assert any(step.arguments[1:2] == ("runjobs",) for step in steps), (
        "no ```console line of the Quickstart runs `python manage.py runjobs`"
    )
    return steps


def read_page(page: Path) -> list[Step]:
    """A tutorial page's steps: its files and commands in order, then its shell."""
    text = page.read_text()
    steps: list[Step] = []
    shell: list[str] = []
    for fence in FENCE.finditer(text):
        language, body = fence["language"], fence["body"]
        before = text[: fence.start()].rstrip().splitlines()
        skipped = bool(before) and bool(SKIP_COMMENT.match(before[-1].strip()))
        if language == "console":
            steps.extend(console_steps(body))
        elif language in ("python", "{literalinclude}"):
            file = file_step(language, fence["argument"], body, page)
            if file:
                steps.append(file)
            elif language == "python" and not skipped:
                shell.append(body)
    if shell:
        steps.append(Step("shell", text="\n".join(shell)))
    return steps


def tutorial_pages() -> list[Path]:
    """The tutorial's pages in the order of its table of contents."""
    toctree = re.search(r"```\{toctree\}\n(?P<body>.*?)```", (TUTORIAL / "index.md").read_text(), re.DOTALL)
    assert toctree
    names = [
        line.strip() for line in toctree["body"].splitlines() if line.strip() and not line.startswith(":")
    ]
    return [TUTORIAL / f"{name}.md" for name in names]


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
        # must pick its own. This checkout's vellum_jobs, wherever the venv's is.
        self.env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.page = "the README's Quickstart"
        # In the folder itself: Django 5.2 makes a project only in a folder that
        # exists, and one beside the new folder would see it as a module "mysite".
        folder.mkdir(parents=True)
        self.python("-m", "django", "startproject", "mysite", ".")

    def python(self, *arguments: str) -> str:
        command = [sys.executable, *arguments]
        done = subprocess.run(
            command, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            pytest.fail(
                f"{self.page}: `python {shlex.join(arguments)}` exited {done.returncode}\n"
                f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}",
                pytrace=False,
            )
        return done.stdout

    def manage(self, *arguments: str) -> str:
        return self.python("manage.py", *arguments)

    def write(self, path: str, block: str) -> None:
        if path in PROJECT_FILES:
            with (self.folder / "mysite" / path).open("a") as file:
                file.write(added_to_project(block))
            return
        target = self.folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block)

    def do(self, step: Step) -> None:
        if step.kind == "file":
            self.write(step.path, step.text)
        elif step.kind == "copy":
            shutil.copytree(SAMPLE_MEDIA, self.folder / step.path / SAMPLE_MEDIA.name, dirs_exist_ok=True)
        elif step.kind == "shell":
            self.manage("shell", "-c", step.text)
        elif step.arguments[1:2] == ("startapp",) and (self.folder / step.arguments[2]).exists():
            return  # the tutorial continues in the Quickstart's app
        else:
            printed = self.python(*step.arguments)
            assert step.output in printed, (
                f"{self.page}: `python {shlex.join(step.arguments)}` printed {printed!r}"
            )

    def jobs(self) -> list[tuple[str, str, str]]:
        """Every job in the project's database: name, state and error."""
        jobs = self.manage(
            "shell",
            "-c",
            "import json\nfrom vellum_jobs.core.models import Job\n"
            "print(json.dumps(list(Job.objects.values_list('name', 'state', 'error'))))",
        )
        return [tuple(job) for job in json.loads(jobs.splitlines()[-1])]


def follow_quickstart(project: Project, steps: list[Step]) -> None:
    for step in steps:
        project.do(step)


def follow_tutorial(project: Project) -> None:
    for page in tutorial_pages():
        project.page = f"docs/tutorial/{page.name}"
        for step in read_page(page):
            project.do(step)


# Slow: a new project and several manage.py processes. `make test` runs it in the
# Python 3.11 SQLite cell, the bare install's (tests/conftest.py shares tests/system/ there).
@pytest.mark.slow
@pytest.mark.skipif(connection.vendor != "sqlite", reason="the new project is on SQLite; once is enough")
@pytest.mark.parametrize("debug", [True, False], ids=["DEBUG=True", "DEBUG=False"])
def test_the_readme_quickstart_runs_a_job_to_done_in_a_new_project(tmp_path: Path, debug: bool):
    """``debug=False`` runs it as deployed: Django then logs no queries, and the enqueue takes the path a
    production web request takes."""
    project = Project(tmp_path / "mysite")
    if not debug:
        project.write("settings.py", "DEBUG = False\nALLOWED_HOSTS = ['localhost']")
    follow_quickstart(project, read_quickstart((ROOT / "README.md").read_text()))
    jobs = project.jobs()
    assert jobs, "the Quickstart's enqueue made no job"
    assert all(state == "done" for _, state, _ in jobs), jobs


@pytest.mark.slow
@pytest.mark.skipif(connection.vendor != "sqlite", reason="the new project is on SQLite; once is enough")
@pytest.mark.parametrize("after_quickstart", [False, True], ids=["new project", "after the Quickstart"])
def test_the_tutorial_works_as_written_in_a_new_project(tmp_path: Path, after_quickstart: bool):
    """Every page's commands succeed and every assert of its shell holds, in a project of the
    tutorial's own or in the one the Quickstart made (whose ``library`` app the tutorial grows)."""
    project = Project(tmp_path / "mysite")
    if after_quickstart:
        follow_quickstart(project, read_quickstart((ROOT / "README.md").read_text()))
    follow_tutorial(project)
    assert ("scan", "done", "") in project.jobs()


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
    steps = read_quickstart(readme)
    assert [(step.kind, step.path or step.arguments[1:]) for step in steps] == [
        ("file", "settings.py"),
        ("command", ("migrate",)),
        ("command", ("runjobs", "--burst")),  # runs until none is due, not until SIGTERM
        ("command", ("runjobs", "--burst")),
        ("file", "library/jobs.py"),
        ("shell", ()),
    ]
    assert steps[-1].text.splitlines()[-2:] == ["job = ping.using(", "    delay=timedelta(0)).enqueue(2)"]


PAGE = """\
# A page

```console
$ pip install vellum-jobs
$ python manage.py startapp library
$ cp -r /tmp/vellum-jobs/example_project/sample_media .
$ python manage.py runserver
```

```{literalinclude} ../../example_project/library/views.py
:language: python
:caption: library/views.py
```

```{literalinclude} ../../example_project/library/jobs.py
:language: python
:pyobject: scan_library
```

<!-- skip: next -->
```python
# urls.py
urlpatterns = [..., path("x/", view)]
```

```python
answer = 42
```

<!-- skip: next -->
```python
raise RuntimeError("left out")
```

```python
assert answer == 42
```
"""


def test_the_rule_reads_a_tutorial_page_s_files_commands_and_shell(tmp_path: Path):
    page = tmp_path / "docs" / "tutorial" / "page.md"
    page.parent.mkdir(parents=True)
    page.write_text(PAGE)
    (tmp_path / "example_project" / "library").mkdir(parents=True)
    (tmp_path / "example_project" / "library" / "views.py").write_text("VIEWS = 1\n")
    steps = read_page(page)
    assert [(step.kind, step.path or step.arguments) for step in steps] == [
        ("command", ("manage.py", "startapp", "library")),
        ("copy", "."),
        ("file", "library/views.py"),
        ("file", "urls.py"),
        ("shell", ()),
    ]
    assert steps[2].text == "VIEWS = 1\n"
    assert steps[-1].text == "answer = 42\n\nassert answer == 42\n"


def test_the_tutorial_s_pages_are_read_in_its_order():
    assert [page.stem for page in tutorial_pages()][:2] == ["install", "first-job"]


def test_a_list_written_with_an_ellipsis_adds_to_the_project_s_list():
    namespace: dict[str, object] = {"INSTALLED_APPS": ["django.contrib.admin", "django.contrib.contenttypes"]}
    exec(added_to_project('INSTALLED_APPS = [..., "django.contrib.contenttypes", "vellum_jobs"]'), namespace)
    apps = ["django.contrib.admin", "django.contrib.contenttypes", "vellum_jobs"]
    assert namespace["INSTALLED_APPS"] == apps
