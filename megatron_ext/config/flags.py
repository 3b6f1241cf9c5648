"""The flag table: every option is a dataclass field, and this module turns fields into flags and back.

A field made with :func:`opt` carries its ``--help`` text, its Megatron-LM
flag spelling and its roles:

* ``estimate=True``: the layout calculator models it, so ``tools/layout.py``
  offers the flag and puts it in the ``pretrain_gpt.py`` command line it emits;
* ``layout=True``: ``ParallelLayout`` takes it (``config.layout_flags`` maps it
  both ways);
* ``env="NAME"``: a recipe sets it from the environment variable ``NAME``
  (``megatron_ext.cli.recipe``).

``pretrain_gpt.py``'s parser, the calculator's parser, the command lines they
emit and the recipes all read these fields, so a new flag is one field.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import field
from typing import Any


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``error: …`` with a hint, and exit code 2 (INVALID)."""

    def __init__(self, *args: Any, unrecognized_hint: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unrecognized_hint = unrecognized_hint

    def error(self, message: str) -> typing.NoReturn:
        hint = self.unrecognized_hint if "unrecognized arguments" in message else ""
        self.exit(2, f"error: {message}{hint or ' (see --help)'}\n")


def at_least(minimum: float, kind: type = int) -> Any:
    """An argparse ``type`` for a number of ``kind`` no smaller than ``minimum`` (one-line error otherwise)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if value < minimum or value != value:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def above(bound: float) -> Any:
    """An argparse ``type`` for a float greater than ``bound``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
        if not value > bound or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a number greater than {bound:g}, got {text}")
        return value

    return parse


def opt(
    default: Any,
    help: str,
    *,
    choices: Sequence[Any] | None = None,
    flag: str | None = None,
    aliases: Sequence[str] = (),
    estimate: bool = False,
    layout: bool = False,
    short: str | None = None,
    env: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> Any:
    """A dataclass field that is also a command-line option.

    ``flag`` and ``aliases`` override the flag's name (default: the field name
    with dashes); ``estimate`` marks what the layout calculator models, with an
    optional ``short`` alias there (``--tp``); ``layout`` marks a flag that ``ParallelLayout`` takes
    (``config.layout_flags``); ``env`` names the recipe variable.
    ``minimum``/``maximum`` bound the value inclusively, ``above``/``below``
    exclusively (``bound_problems`` checks them for every tool that takes the flag).
    """
    metadata = {
        "help": help,
        "choices": choices,
        "flag": flag,
        "aliases": tuple(aliases),
        "estimate": estimate,
        "layout": layout,
        "short": short,
        "env": env,
        "minimum": minimum,
        "maximum": maximum,
        "above": above,
        "below": below,
    }
    return field(default=default, metadata=metadata)


def flag_of(f: dataclasses.Field[Any]) -> str:
    """The field's command-line flag: ``--num-layers`` for ``num_layers``."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    # Evaluating a class's annotations takes about a millisecond each time; a parser asks once per field.
    return typing.get_type_hints(cls)


def value_type(cls: type, name: str) -> tuple[Any, bool]:
    """(element type, takes several values) of field ``name`` of ``cls``, Optional removed."""
    tp = _type_hints(cls)[name]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
        origin = typing.get_origin(tp)
    if origin is tuple:
        return typing.get_args(tp)[0], True
    return tp, False


def options(cls: type, *, estimate: bool | None = None) -> list[dataclasses.Field[Any]]:
    """The option fields of ``cls``: all of them, or those the calculator models (``estimate=True``) or not."""
    return [f for f in dataclasses.fields(cls) if estimate is None or f.metadata.get("estimate", False) == estimate]


def add_options(
    group: argparse._ArgumentGroup,
    cls: type,
    fields: Iterable[dataclasses.Field[Any]],
    *,
    dest: str = "{name}",
    suppress_defaults: bool = True,
    short_aliases: bool = False,
) -> None:
    """Add ``fields`` of ``cls`` to ``group`` as flags, with their help, type and choices.

    ``suppress_defaults``: only options given on the command line appear in the
    namespace (so that the dataclass defaults apply); otherwise absent options
    are None (False for switches). ``short_aliases`` adds the calculator's
    ``--tp``-style spellings.
    """
    for f in fields:
        tp, is_list = value_type(cls, f.name)
        kwargs: dict[str, Any] = {"dest": dest.format(name=f.name), "help": f.metadata["help"]}
        if suppress_defaults:
            kwargs["default"] = argparse.SUPPRESS
        if tp is bool:
            kwargs["action"] = "store_true"
            if not suppress_defaults:
                kwargs["default"] = False
        else:
            kwargs["type"] = tp
            kwargs["metavar"] = f.name.upper()
            if not suppress_defaults:
                kwargs["default"] = None
            if is_list:
                kwargs["nargs"] = "+"
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
        names = [flag_of(f), *f.metadata.get("aliases", ())]
        if short_aliases and f.metadata.get("short"):
            names.append(f.metadata["short"])
        group.add_argument(*names, **kwargs)


def bound_problems(values: Any) -> list[str]:
    """Every field of an options dataclass instance outside its bounds, each naming the flag, value and range."""
    problems = []
    for f in dataclasses.fields(values):
        value = getattr(values, f.name)
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        lo, hi, above = f.metadata.get("minimum"), f.metadata.get("maximum"), f.metadata.get("above")
        below = f.metadata.get("below")
        if above is not None and not value > above:
            problems.append(f"{flag_of(f)} must be greater than {above:g}, got {value:g}")
        elif lo is not None and value < lo:
            problems.append(f"{flag_of(f)} must be at least {lo:g}, got {value:g}")
        elif hi is not None and value > hi:
            problems.append(f"{flag_of(f)} must be at most {hi:g}, got {value:g}")
        elif below is not None and not value < below:
            problems.append(f"{flag_of(f)} must be less than {below:g}, got {value:g}")
        elif value != value or value in (float("inf"), float("-inf")):  # NaN, infinities
            problems.append(f"{flag_of(f)} must be a finite number, got {value}")
    return problems


def to_argv(values: Any, *, only: Iterable[str] | None = None, always: Iterable[str] = ()) -> list[str]:
    """The flags that give an options dataclass instance ``values``: those that differ from the defaults.

    ``only`` limits the fields considered; ``always`` are emitted even at their
    default (when not None). Switches are emitted when true; several values
    follow their flag.
    """
    wanted = set(only) if only is not None else None
    forced = set(always)
    argv: list[str] = []
    for f in dataclasses.fields(values):
        if wanted is not None and f.name not in wanted:
            continue
        value = getattr(values, f.name)
        if value is None or (value == f.default and f.name not in forced):
            continue
        if value is True:
            argv.append(flag_of(f))
        elif value is False:
            continue
        elif isinstance(value, tuple | list):
            argv += [flag_of(f), *map(str, value)]
        else:
            argv += [flag_of(f), str(value)]
    return argv
