"""Run a pydantic schema over YAML data and report errors as file:line:column issues."""

from __future__ import annotations

import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from turnout.oracle.errors import Issue, PackError
from turnout.oracle.yamlpos import Positions

M = TypeVar("M", bound=BaseModel)


def _unwrap(tp: Any) -> list[Any]:
    """The concrete types behind Annotated / Optional / unions."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(tp) for t in _unwrap(a)]
    return [tp]


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the mapping at ``loc``, if the path leads to one."""
    current: list[Any] = [root]
    for part in loc:
        nxt: list[Any] = []
        for tp in current:
            origin = typing.get_origin(tp)
            if isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
                nxt += _unwrap(tp.model_fields[part].annotation)
            elif origin is list and isinstance(part, int):
                nxt += _unwrap(typing.get_args(tp)[0])
            elif origin is dict and isinstance(part, str):
                nxt += _unwrap(typing.get_args(tp)[1])
        current = nxt
    for tp in current:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return tp
    return None


def _message(root: type[BaseModel], err: Any) -> str:
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        holder = _model_at(root, loc[:-1])
        expected = f"; expected one of: {', '.join(holder.model_fields)}" if holder else ""
        return f"unknown key {loc[-1]!r}{expected}"
    where = ".".join(str(p) for p in loc if not str(p).startswith(("function-", "json-")))
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{where}: {msg}" if where else msg


def validate_model(root: type[M], data: Any, pos: Positions) -> M:
    """``root.model_validate(data)``; every error becomes an Issue at its node's position."""
    try:
        return root.model_validate(data)
    except ValidationError as exc:
        issues: list[Issue] = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            prefer_key = err["type"] == "extra_forbidden"
            issues.append(pos.issue(loc, _message(root, err), prefer_key=prefer_key))
        raise PackError(issues) from None
