"""Where each run option of a command came from, so that an error names it as the user gave
it: the flag they typed (``-b/--minbytes 0``), the key of their YAML config
(``min_bytes: 0 in 'run.yaml'``), or the flag with its default
(``-e/--maxbytes 1M (the default)``).

The library names options by their keys (``runtime.errors.OptionError``); this is where the
command line translates.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ..runtime.config import as_typed, load_yaml_config
from ..runtime.errors import OptionError

__all__ = ["OptionOrigins", "flag_names", "as_flags"]

# Library messages name a call's arguments as Python spells them (``backend='host'``); a
# command line's user typed flags. Not after a dot or a word: ``self.exchange='mpi'``
# is code, not an argument.
_ARGUMENT = re.compile(r"(?<![\w.])(backend|exchange|handle|algo|inter)='([^']*)'")


def as_flags(message: str, flags: Mapping[str, str]) -> str:
    """``message`` with each argument that is one of ``flags`` (destination -> flags, as
    ``flag_names`` gives them) named as its long flag: ``use backend='host'`` -> ``use
    --backend host``. Arguments the command has no flag for stay as they are."""
    def flag(match: re.Match) -> str:
        name, value = match.groups()
        if name not in flags:
            return match.group(0)
        return f"{flags[name].split('/')[-1]} {value}"
    return _ARGUMENT.sub(flag, message)


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Destination -> its flags as argparse's own errors name them (``-b/--minbytes``)."""
    # argparse has no public list of a parser's actions; _actions is what its help reads.
    return {action.dest: "/".join(action.option_strings)
            for action in parser._actions if action.option_strings}


@dataclasses.dataclass(frozen=True)
class OptionOrigins:
    """The options of one command line: ``from_flags`` (None: not given), ``from_file``
    (the ``--config`` file's mapping, read once) and how to name each."""

    from_flags: Mapping[str, Any]
    from_file: Mapping[str, Any]
    config_path: str | None
    flags: Mapping[str, str]

    @classmethod
    def of(cls, args: argparse.Namespace, fields: tuple[str, ...]) -> OptionOrigins:
        """The origins of ``fields`` on ``args``; reads ``args.config`` when given.

        Raises:
            ConfigError: the config file is missing, unreadable or not a YAML mapping.
        """
        path = getattr(args, "config", None)
        return cls(from_flags={field: getattr(args, field, None) for field in fields},
                   from_file=load_yaml_config(path) if path else {}, config_path=path,
                   flags=getattr(args, "option_flags", {}))

    def name(self, field: str, shown: str) -> str:
        """``field`` with its value, as the user gave it (``shown``: the library's
        spelling of the value, used where the user typed none)."""
        flag = self.flags.get(field)
        typed = self.from_flags.get(field)
        if flag and typed is not None:
            return f"{flag} {as_typed(typed)}"
        for key, value in self.from_file.items():
            if key.replace("-", "_") == field and value is not None:
                return f"{key}: {as_typed(value)} in {self.config_path!r}"
        return f"{flag} {shown} (the default)" if flag else f"{field} {shown}"

    @contextlib.contextmanager
    def naming_options(self) -> Iterator[None]:
        """Raise an OptionError of the body again, naming each option as the user gave
        it."""
        try:
            yield
        except OptionError as exc:
            raise OptionError(exc.render(self.name)) from None
