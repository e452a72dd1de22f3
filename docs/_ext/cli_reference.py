"""The command reference's parser: the real one (`idem_dialects.cli.reference_parser`, every subcommand with every
option), its help texts escaped for reStructuredText, which sphinx-argparse renders them as (a `*` or a trailing `_`
in a terminal help text, as in ``mssql-*`` or ``idem_``, is markup there)."""

from __future__ import annotations

import argparse
import re

from idem_dialects.cli import reference_parser

_MARKUP = re.compile(r"([*`|_])")


def _escaped(text: str | None) -> str | None:
    return None if text is None else _MARKUP.sub(r"\\\1", text)


def parser() -> argparse.ArgumentParser:
    root = reference_parser()
    todo = [root]
    while todo:
        current = todo.pop()
        current.description = _escaped(current.description)
        current.epilog = _escaped(current.epilog)
        for action in current._actions:
            if action.help not in (None, argparse.SUPPRESS):
                action.help = _escaped(action.help)
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    choice.help = _escaped(choice.help)
                todo += action.choices.values()
    return root
