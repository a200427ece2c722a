"""Generate argparse flags from frozen config dataclasses (defaults and help live in one place).

Each field becomes ``--<prefix><field-name>``; its help text is the attribute docstring written
under the field, its type and choices come from the annotation (``Literal`` gives choices,
``X | None`` an optional value, ``bool`` a ``--flag/--no-flag`` pair).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def attribute_docs(cls: type) -> dict[str, str]:
    """Map field name -> the string literal that follows it in the class body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """Strip ``| None``; return (type, optional)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return annotation, False


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, prefix: str, title: str,
                       exclude: tuple[str, ...] = ()) -> None:
    """Add one flag per field of ``cls`` except those in ``exclude`` (the caller adds those itself)."""
    group = parser.add_argument_group(title)
    docs = attribute_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        flag = f"--{prefix}{f.name.replace('_', '-')}"
        base, optional = _base_type(hints[f.name])
        help_text = docs.get(f.name, "").replace("%", "%%")  # argparse formats help with %
        dest = f"{prefix.replace('-', '_')}{f.name}"
        if base is bool:
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=f.default,
                               help=help_text)
        elif typing.get_origin(base) is typing.Literal:
            group.add_argument(flag, dest=dest, choices=list(typing.get_args(base)), default=f.default,
                               help=f"{help_text} (default: %(default)s)")
        else:
            group.add_argument(flag, dest=dest, type=base, default=f.default,
                               metavar=base.__name__.upper(),
                               help=f"{help_text} "
                                    f"(default: {'none' if optional and f.default is None else '%(default)s'})")


def from_namespace(cls: type[T], ns: argparse.Namespace, prefix: str, **given: Any) -> T:
    """Build ``cls`` from parsed flags; ``given`` supplies the fields excluded from the flags."""
    key = prefix.replace("-", "_")
    return cls(**{f.name: given[f.name] if f.name in given else getattr(ns, f"{key}{f.name}")
                  for f in dataclasses.fields(cls)})
