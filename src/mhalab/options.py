"""Command-line options from dataclasses: the one parser of every command but `train` (`mhalab.cli`).

Each field of a command's options dataclass is an option `--field-name` (`--field_name` and `field_name=value` too);
a nested dataclass's fields are `--outer.name`; a field made with `option(positional=True)` is positional. Types:
bool (`--x`, `--no-x`, `x=true`), int, float, str, Path, Literal (choices), lists (`--x [a,b]` sets one, `--x a,b`
and `--x a` add to it), Optional (`null` is None) and dicts (YAML). Values are checked by the dataclass's own
`__post_init__`; every error is a `ConfigError` of one sentence. argparse does the parsing, so `--help` needs nothing
but this module. Written here rather than taken from a library: jsonargparse keeps underscores in option names and
wants `--flag true`; tyro words its errors as a panel of several lines; both are a new dependency, and the command
lines users know (argparse's wording, `--no-plots`, `--allow` repeated, `key=value`) would change.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from mhalab.checks import check_int
from mhalab.errors import ConfigError

TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def option(default: Any = MISSING, help: str = "", *, positional: bool = False, metavar: str | None = None):
    """A field with its help text; a list default is copied for each instance."""
    meta = {"help": help, "positional": positional, "metavar": metavar}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Threads:
    """The one `threads` option of every command but `train` (whose config key is `torch_threads`)."""

    threads: Optional[int] = field(default=None, kw_only=True, metadata={
        "help": "torch's threads (1 is fastest on a small, busy CPU)"})

    def __post_init__(self):
        if self.threads is not None:
            check_int("--threads", self.threads, 1, 4096)

    def apply_threads(self) -> None:
        """Set torch's intra-op threads when `threads` is given."""
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)


class Parser(argparse.ArgumentParser):
    """argparse whose errors are a ConfigError (one sentence) instead of usage text and an exit."""

    def error(self, message: str):
        raise ConfigError(f"{message} (`{self.prog} --help` lists the options)")


def _unwrap(tp) -> tuple[Any, bool]:
    """(the type inside Optional, whether None is allowed)."""
    if typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), True
    return tp, False


def _is_list(tp) -> bool:
    return typing.get_origin(_unwrap(tp)[0]) in (list, tuple)


def metavar(tp) -> str:
    """How a value of type `tp` is written: INT, {a,b}, [INT,...]."""
    inner = _unwrap(tp)[0]
    if typing.get_origin(inner) in (list, tuple):
        return f"[{metavar(typing.get_args(inner)[0] if typing.get_args(inner) else str)},...]"
    if typing.get_origin(inner) is Literal:
        return "{" + ",".join(map(str, typing.get_args(inner))) + "}"
    return {int: "INT", float: "FLOAT", str: "TEXT", Path: "PATH", bool: "BOOL"}.get(inner, "YAML")


def _split(text: str) -> list[str]:
    """`[a,b]` or `a,b` into items, commas inside brackets kept (`[x=[1,2],y]`)."""
    body = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    items.append(body[start:])
    return [s.strip() for s in items] if body.strip() else []


def converter(tp):
    """A function text -> value of type `tp`, named as argparse words its errors (`invalid int value`)."""
    inner, optional = _unwrap(tp)
    if typing.get_origin(inner) in (list, tuple):
        each = converter(typing.get_args(inner)[0] if typing.get_args(inner) else str)

        def convert(text):
            if optional and text == "null":
                return None
            items = [each(s) for s in _split(text)]
            return Whole(items) if text.startswith("[") else items
        convert.__name__ = f"list of {each.__name__}"
    elif typing.get_origin(inner) is Literal:
        choices = typing.get_args(inner)

        def convert(text):
            if optional and text == "null":
                return None
            if text not in choices:
                raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from "
                                                 + ", ".join(map(repr, choices)) + ")")
            return text
        convert.__name__ = "choice"
    else:
        base = {bool: _bool, int: int, float: float, str: str, Path: Path}.get(inner, _yaml)

        def convert(text):
            return None if optional and text == "null" else base(text)
        convert.__name__ = base.__name__
    return convert


def _bool(text: str) -> bool:
    if text.lower() not in TRUE + FALSE:
        raise ValueError(text)
    return text.lower() in TRUE


def _yaml(text: str):
    import yaml

    return yaml.safe_load(text)


_yaml.__name__, _bool.__name__ = "YAML", "bool"


class Whole(list):
    """A list written in brackets, `[a,b]`: the whole value of its option."""


class _Items(argparse.Action):
    """A list option: `--x [a,b]` (or `x=[a,b]`) sets it; `--x a` and `--x a,b` add to it, the first use replacing
    the default (`--allow a --allow b`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        have = getattr(namespace, self.dest, None)
        whole = have is None or values is None or isinstance(values, Whole)
        setattr(namespace, self.dest, list(values) if whole and values is not None else values if whole
                else have + values)


def parser(cls, prog: str, description: str = "") -> Parser:
    """The parser of options dataclass `cls`: every option's default is left out (argparse.SUPPRESS), so `build`
    takes the dataclass's own."""
    p = Parser(prog=prog, description=description or (cls.__doc__ or "").strip().splitlines()[0])
    _add(p, cls, "")
    return p


def _add(p: Parser, cls, prefix: str) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, name = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(tp):
            _add(p, tp, name + ".")
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        help_ = f.metadata.get("help", "")
        if default not in (MISSING, None, []) and not isinstance(default, bool):
            help_ = f"{help_} (default {json.dumps(default, default=str)})".strip()
        flag = "--" + name.replace("_", "-")
        kw = {"help": help_, "metavar": f.metadata.get("metavar") or metavar(tp), "default": argparse.SUPPRESS}
        if f.metadata.get("positional"):
            p.add_argument(name, type=converter(typing.get_args(tp)[0]) if _is_list(tp) else converter(tp),
                           nargs="+" if _is_list(tp) else None, **{**kw, "metavar": f.metadata.get("metavar") or name})
        elif _unwrap(tp)[0] is bool:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, help=help_,
                           default=argparse.SUPPRESS)
        else:
            p.add_argument(flag, dest=name, type=converter(tp), action=_Items if _is_list(tp) else "store",
                           required=default is MISSING, **kw)


def normalise(argv: list[str], p: Parser) -> list[str]:
    """`key=value` becomes `--key=value` (but not a path that exists, nor the value of an option that takes one:
    `--baseline seed=0`); underscores in option names become dashes; `--flag=false` becomes `--no-flag`."""
    takes_value = {o for o, a in p._option_string_actions.items() if a.nargs != 0}
    flags = {o for o, a in p._option_string_actions.items() if isinstance(a, argparse.BooleanOptionalAction)}
    out = []
    for i, a in enumerate(argv):
        key, eq, value = a.partition("=")
        if eq and not a.startswith("-") and key.replace("_", "").replace("-", "").replace(".", "").isalnum() \
                and not Path(a).exists() and not (out and out[-1] in takes_value):
            a = f"--{a}"
        if a.startswith("--"):
            key, eq, value = a.partition("=")
            key = "--" + key[2:].replace("_", "-")
            if eq and key in flags:
                if value.lower() not in TRUE + FALSE:
                    raise ConfigError(f"{key[2:]}={value}: give true or false")
                key, eq, value = (key if value.lower() in TRUE else "--no-" + key[2:]), "", ""
            a = key + eq + value
        out.append(a)
    return out


def parse(cls, argv: list[str], prog: str | None = None):
    """An instance of options dataclass `cls` from command-line arguments; a ConfigError names what is wrong."""
    p = parser(cls, prog or cls.__name__)
    tokens = normalise(list(argv), p)
    values, unknown = p.parse_known_args(tokens)
    if unknown:
        original = argv[tokens.index(unknown[0])] if unknown[0] in tokens else unknown[0]
        p.error(f"unknown argument {original!r}")
    return build(cls, vars(values))


def build(cls, values: dict[str, Any], prefix: str = ""):
    """`cls` from the parsed `values` (keys with dots for nested dataclasses); what was not given keeps its default."""
    hints, kwargs = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        name = prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            if any(k.startswith(name + ".") for k in values):
                kwargs[f.name] = build(hints[f.name], values, name + ".")
        elif name in values:
            kwargs[f.name] = values[name]
    return cls(**kwargs)


def to_yaml(options) -> str:
    """The options as YAML (`--cfg`)."""
    import yaml

    return yaml.safe_dump(json.loads(json.dumps(dataclasses.asdict(options), default=str)), sort_keys=False)
