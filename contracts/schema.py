"""The JSON Schema of the report, and validation against it.

`report.schema.json` (beside this module) is the published contract.  It is derived from
the dataclasses in `report.py`; the test suite checks that the shipped file and the
dataclasses agree, so a change to one without the other (and a version bump) fails.
Regenerate with `python -m fuselens.contracts.schema > contracts/report.schema.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from typing import Any

from . import report as R

SCHEMA_PATH = os.path.join(os.path.dirname(__file__), "report.schema.json")


def _type_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [_type_schema(a, defs) for a in typing.get_args(tp)]
        return {"anyOf": options}
    if tp is type(None):
        return {"type": "null"}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return {"type": "array", "items": _type_schema(item, defs)}
    if origin is dict:
        return {"type": "object"}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}  # reserve, for recursion
            hints = typing.get_type_hints(tp)
            fields = dataclasses.fields(tp)
            defs[name] = {
                "type": "object",
                "properties": {f.name: _type_schema(hints[f.name], defs) for f in fields},
                "required": [f.name for f in fields],
                "additionalProperties": False,
            }
        return {"$ref": f"#/$defs/{name}"}
    return {
        bool: {"type": "boolean"},
        int: {"type": "integer"},
        float: {"type": "number"},
        str: {"type": "string"},
    }.get(tp, {})


def generate_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    root = _type_schema(R.Report, defs)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://fuselens.dev/schema/report-v{R.SCHEMA_VERSION}.json",
        "title": "fuselens analysis report",
        **root,
        "$defs": defs,
    }
    schema["$defs"]["Report"]["properties"]["schema_version"] = {"const": R.SCHEMA_VERSION}
    schema["$defs"]["Rejection"]["properties"]["reason"] = {"enum": sorted(R.REJECTION_REASONS)}
    return schema


def load_schema() -> dict[str, Any]:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        schema: dict[str, Any] = json.load(fh)
    return schema


def validate_report(data: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError if `data` breaks the published contract."""
    import jsonschema

    jsonschema.validate(data, load_schema())


if __name__ == "__main__":
    print(json.dumps(generate_schema(), indent=2))
