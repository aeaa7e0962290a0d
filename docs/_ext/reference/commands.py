"""The commands page: each management command's usage and every option of its own ``create_parser()``.

Options come from the parsers themselves, so a new one appears by itself;
one without a help text raises ``Incomplete``. Django's options common to
every command are named in one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from django.core.management import find_commands, load_command_class
from django.core.management.base import BaseCommand

from docs._ext.reference import PACKAGE, Incomplete
from docs._ext.reference.markdown import code, prose, table


def command_names() -> list[str]:
    """The package's management commands, by name."""
    return sorted(find_commands(str(PACKAGE / "management")))


def parser_of(name: str) -> argparse.ArgumentParser:
    command = load_command_class("vellum_jobs", name)
    assert isinstance(command, BaseCommand)
    return command.create_parser("manage.py", name)


def _django_dests() -> set[str]:
    """The options Django gives every command (``--verbosity``, ``--settings``...)."""
    return {action.dest for action in BaseCommand().create_parser("manage.py", "command")._actions}


def own_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a command declares itself, without Django's common ones and ``--help``."""
    django_dests = _django_dests()
    return [action for action in parser._actions if action.dest not in django_dests]


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _with_value(option: str, action: argparse.Action) -> str:
    if action.nargs == 0:
        return option
    metavar = _metavar(action)
    if action.nargs in ("+", "*"):
        return f"{option} {metavar} [{metavar} ...]".strip()
    if action.nargs == "?":
        return f"{option} [{metavar}]".strip()
    return f"{option} {metavar}".strip()


def invocation(action: argparse.Action) -> str:
    """How the command line gives ``action``: ``--workers WORKERS``, ``QUEUE [QUEUE ...]``."""
    if not action.option_strings:
        return _with_value("", action)
    return ", ".join(_with_value(option, action) for option in action.option_strings)


def usage(prog: str, actions: list[argparse.Action], width: int = 80) -> str:
    """The command line with the command's own arguments, wrapped at ``width``."""
    parts = []
    for action in actions:
        if isinstance(action, argparse._SubParsersAction):
            parts.append(f"{_metavar(action)} ...")
        elif not action.option_strings or action.required:
            parts.append(_with_value(action.option_strings[0] if action.option_strings else "", action))
        else:
            parts.append(f"[{_with_value(action.option_strings[0], action)}]")
    lines = [prog]
    for part in parts:
        if len(lines[-1]) + 1 + len(part) > width:
            lines.append(" " * (len(prog.split()[0]) + 1) + part)
        else:
            lines[-1] += " " + part
    return "\n".join(lines)


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS) or not action.option_strings:
        return "—"
    return code(str(action.default))


def _options_table(actions: list[argparse.Action]) -> str:
    rows = []
    for action in actions:
        if action.option_strings and not action.help:
            raise Incomplete(f"option {action.option_strings[0]} has no help text")
        rows.append((code(invocation(action)), _default(action), prose(action.help or "")))
    return table(("option", "default", "description"), rows)


def _subcommands(
    action: argparse._SubParsersAction[Any],
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    for name, parser in action.choices.items():
        yield name, helps.get(name, ""), parser


def command_markdown(name: str) -> str:
    """One command: what it does, its usage, every option of its own and Django's common ones."""
    parser = parser_of(name)
    actions = own_actions(parser)
    command = load_command_class("vellum_jobs", name)
    plain = [action for action in actions if not isinstance(action, argparse._SubParsersAction)]
    parts = [
        f"(command-{name})=",
        f"## {code(name)}",
        prose(str(command.help)),
        f"```text\n{usage(f'manage.py {name}', actions)}\n```",
    ]
    if plain:
        parts.append(_options_table(plain))
    if parser.epilog:
        parts.append(prose(parser.epilog))
    for action in actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, help_text, subparser in _subcommands(action):
                sub_actions = own_actions(subparser)
                parts += [
                    f"### {code(f'{name} {sub}')}",
                    prose(help_text),
                    f"```text\n{usage(f'manage.py {name} {sub}', sub_actions)}\n```",
                ]
                options = [a for a in sub_actions if a.option_strings]
                if options:
                    parts.append(_options_table(options))
    django_options = [action for action in parser._actions if action not in actions]
    parts.append(
        "Django's options, as every command has them: "
        + ", ".join(code(invocation(action)) for action in django_options)
        + "."
    )
    return "\n\n".join(parts)


def commands_markdown() -> str:
    return "\n\n".join(command_markdown(name) for name in command_names())
