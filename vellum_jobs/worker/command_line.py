"""Starting another copy of this process's own command: how ``runjobs --processes`` starts its children.

The interpreter is rebuilt from ``sys.orig_argv``, so its options and the way
it found the program come along: ``python -X dev -m django runjobs`` starts
``python -X dev -m django runjobs``, where ``[sys.executable, *sys.argv]``
would run django's ``__main__.py`` as a script, with the wrong ``sys.path``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def command(argv: Sequence[str], *, without: str) -> list[str]:
    """This interpreter as it was started, then ``argv[1:]`` less the option ``without`` and its value.

    ``argv`` is what ``manage.py`` (or ``django-admin``, or ``python -m
    django``) passed to a command: the program, the subcommand, its options.
    """
    return [*_interpreter(), *without_option(argv[1:], without)]


def _interpreter() -> list[str]:
    """This interpreter, its options and its script or module: ``python -X dev -m django``."""
    # sys.orig_argv is [python, *options, script | -m module | -c code, *args]
    # and sys.argv is [script, *args].
    args = sys.argv[1:]
    head = sys.orig_argv[: len(sys.orig_argv) - len(args)]
    if sys.orig_argv[len(head) :] != args:  # the program rewrote sys.argv: start its script again
        return [sys.executable, sys.argv[0]]
    return [sys.executable, *head[1:]]


def without_option(args: Sequence[str], option: str) -> list[str]:
    """``args`` less ``option N``, ``option=N``, or a prefix of ``option`` that argparse accepted."""
    kept: list[str] = []
    value_next = False
    for arg in args:
        if value_next:
            value_next = False
            continue
        name, equals, _ = arg.partition("=")
        if len(name) > 2 and option.startswith(name):
            value_next = not equals
            continue
        kept.append(arg)
    return kept
