"""Dataclasses to and from their JSON form: the one codec every contract uses.

`to_plain` turns a contract dataclass into dicts, lists and scalars (what `json.dumps`
takes).  `from_plain` reads it back, checked against the dataclass's type hints: an
unknown key, a missing required field or a value of the wrong type is a `ContractError`
naming the path to it (`models[0].clusters[2].lines`), never silently dropped.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class ContractError(ValueError):
    """Data that does not have the shape of the contract it claims to be."""


def to_plain(value: Any) -> Any:
    """`value` as JSON-ready data: dataclasses become dicts of their fields, in field order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


def from_plain(tp: type[T], data: Any, where: str = "") -> T:
    """`data` read back as a `tp` (a contract dataclass), checked field by field."""
    return typing.cast(T, _read(tp, data, where or getattr(tp, "__name__", "value")))


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(tp: type) -> dict[str, Any]:
    hints = _HINTS.get(tp)
    if hints is None:
        hints = _HINTS[tp] = typing.get_type_hints(tp)
    return hints


def _read(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _read_union(typing.get_args(tp), value, where)
    if tp is type(None):
        if value is not None:
            raise ContractError(f"{where}: expected null, got {_kind(value)}")
        return None
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            allowed = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ContractError(f"{where}: {value!r} is not one of {allowed}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ContractError(f"{where}: expected a list, got {_kind(value)}")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ContractError(f"{where}: expected {len(args)} items, got {len(value)}")
            return tuple(_read(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
        item = args[0] if args else Any
        items = [_read(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected an object, got {_kind(value)}")
        _, item = typing.get_args(tp) or (str, Any)
        return {str(k): _read(item, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _read_dataclass(tp, value, where)
    return _read_scalar(tp, value, where)


def _read_union(options: tuple[Any, ...], value: Any, where: str) -> Any:
    if value is None and type(None) in options:
        return None
    tagged = _tagged(options, value, where)
    if tagged is not None:
        return _read(tagged, value, where)
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _read(option, value, where)
        except ContractError as exc:
            errors.append(str(exc))
    raise ContractError(errors[0] if len(errors) == 1 else f"{where}: matches none of: " + "; ".join(errors))


def _tagged(options: tuple[Any, ...], value: Any, where: str) -> Any:
    """A tagged union (`kind: Literal["analyze"]` on each member): the member `value`'s tag names.

    None when the members carry no tag, so that the union is read member by member instead."""
    if not isinstance(value, dict):
        return None
    tags: dict[tuple[str, Any], Any] = {}
    for option in options:
        if not (isinstance(option, type) and dataclasses.is_dataclass(option)):
            continue
        for name, hint in _hints(option).items():
            if typing.get_origin(hint) is typing.Literal and len(typing.get_args(hint)) == 1:
                tags[(name, typing.get_args(hint)[0])] = option
    if not tags:
        return None
    fields = {name for name, _ in tags}
    for name in fields:
        if (name, value.get(name)) in tags:
            return tags[(name, value.get(name))]
    known = ", ".join(repr(tag) for _, tag in tags)
    field_names = "/".join(sorted(fields))
    raise ContractError(f"{where}: {field_names} {value.get(next(iter(fields)))!r} is not one of {known}")


def _read_dataclass(tp: type, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ContractError(f"{where}: expected an object, got {_kind(value)}")
    hints = _hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ContractError(
            f"{where}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(fields)})"
        )
    missing = [
        name
        for name, f in fields.items()
        if name not in value and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ContractError(f"{where}: missing field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    return tp(**{k: _read(hints[k], v, f"{where}.{k}") for k, v in value.items()})


def _read_scalar(tp: Any, value: Any, where: str) -> Any:
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool):
        raise ContractError(f"{where}: expected an integer, got a boolean")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ContractError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {_kind(value)}")


def _kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)
