"""Example inputs and constructor arguments: where they come from and how they are read.

Sources, highest precedence first:
1. the command line (`--input-shape 16384,1024 --dtype float32`, repeatable);
2. `[tool.fuselens.models.<Class>]` in the nearest `pyproject.toml`;
3. an inline comment on the class line: `class Net(nn.Module):  # fuselens: input=(16384, 1024) float32`;
4. an `example_inputs()` classmethod on the model, or a module-level `example_inputs()`
   (returning a dict keyed by class name, or inputs for the file's top-level model).

Sources 1-3 are parsed here as plain data (no torch, nothing evaluated); source 4 is
user code and is called by the loader inside the worker.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

DTYPES = {
    "float32", "float", "float16", "half", "bfloat16", "float64", "double", "int64", "long",
    "int32", "int", "int16", "int8", "uint8", "bool",
}
_CANONICAL = {"float": "float32", "half": "float16", "double": "float64", "long": "int64", "int": "int32"}


class InputSpecError(ValueError):
    """A malformed input specification; the message names where it came from."""


@dataclass
class InputSpec:
    shape: list[int]
    dtype: str = "float32"

    def describe(self) -> str:
        return f"({', '.join(map(str, self.shape))}) {self.dtype}"


@dataclass
class ModelConfig:
    """What the user told us about one model class."""

    inputs: list[InputSpec] | None = None
    inputs_source: str = ""
    init: dict[str, Any] = field(default_factory=dict)
    init_source: str = ""
    param_dtype: str | None = None  # cast the model's parameters (e.g. "bfloat16")


def canonical_dtype(name: str, where: str) -> str:
    name = name.strip().removeprefix("torch.")
    if name not in DTYPES:
        raise InputSpecError(f"{where}: unknown dtype {name!r} (use one of {', '.join(sorted(DTYPES))})")
    return _CANONICAL.get(name, name)


def parse_shape(text: str, where: str) -> list[int]:
    parts = [p for p in re.split(r"[,\s]+|(?<=\d)[x×](?=\d)", text.strip().strip("()[]")) if p]
    try:
        shape = [int(p) for p in parts]
    except ValueError:
        raise InputSpecError(f"{where}: shape {text!r} must be integers like 16384,1024") from None
    if any(d < 0 for d in shape):
        raise InputSpecError(f"{where}: shape {text!r} has a negative size")
    return shape


def from_cli(shapes: list[str] | None, dtypes: list[str] | None) -> list[InputSpec] | None:
    if not shapes:
        return None
    dtypes = dtypes or ["float32"]
    if len(dtypes) not in (1, len(shapes)):
        raise InputSpecError(f"--dtype: give one dtype, or one per --input-shape ({len(shapes)})")
    if len(dtypes) == 1:
        dtypes = dtypes * len(shapes)
    return [InputSpec(parse_shape(s, "--input-shape"), canonical_dtype(d, "--dtype")) for s, d in zip(shapes, dtypes)]


# ---- pyproject.toml ------------------------------------------------------------------


def find_pyproject(path: str) -> str | None:
    directory = os.path.dirname(os.path.abspath(path))
    while True:
        candidate = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def read_tool_table(pyproject: str | None) -> dict[str, Any]:
    if not pyproject:
        return {}
    try:
        with open(pyproject, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputSpecError(f"{pyproject}: cannot read [tool.fuselens]: {exc}") from None
    table = data.get("tool", {}).get("fuselens", {})
    if not isinstance(table, dict):
        raise InputSpecError(f"{pyproject}: [tool.fuselens] must be a table")
    return table


def from_pyproject(table: dict[str, Any], class_name: str, pyproject: str) -> ModelConfig:
    models = table.get("models", {})
    entry = models.get(class_name) if isinstance(models, dict) else None
    config = ModelConfig()
    if entry is None:
        return config
    where = f"{os.path.basename(pyproject)} [tool.fuselens.models.{class_name}]"
    if not isinstance(entry, dict):
        raise InputSpecError(f"{where} must be a table")
    if "inputs" in entry:
        config.inputs = _pyproject_inputs(entry["inputs"], entry.get("dtype", "float32"), where)
        config.inputs_source = where
    if "init" in entry:
        if not isinstance(entry["init"], dict):
            raise InputSpecError(f"{where}.init must be a table of constructor keyword arguments")
        config.init = dict(entry["init"])
        config.init_source = where
    return config


def _pyproject_inputs(value: Any, default_dtype: str, where: str) -> list[InputSpec]:
    if not isinstance(value, list) or not value:
        raise InputSpecError(f"{where}.inputs must be a list of shapes, e.g. [[16384, 1024]]")
    if all(isinstance(v, int) for v in value):  # a single shape written flat
        value = [value]
    specs = []
    for i, item in enumerate(value):
        here = f"{where}.inputs[{i}]"
        if isinstance(item, dict):
            if not isinstance(item.get("shape"), list):
                raise InputSpecError(f"{here} needs a 'shape' list")
            specs.append(InputSpec(_int_list(item["shape"], here), canonical_dtype(str(item.get("dtype", default_dtype)), here)))
        elif isinstance(item, list):
            specs.append(InputSpec(_int_list(item, here), canonical_dtype(str(default_dtype), where)))
        else:
            raise InputSpecError(f"{here} must be a shape list or {{shape = [...], dtype = \"...\"}}")
    return specs


def _int_list(value: list, where: str) -> list[int]:
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise InputSpecError(f"{where}: shape must be a list of non-negative integers")
    return list(value)


# ---- inline comments -----------------------------------------------------------------

_INLINE = re.compile(r"#\s*fuselens:\s*(?P<body>.*)$")
_INPUT = re.compile(r"input\s*=\s*\(\s*(?P<shape>[^)]*)\)\s*(?P<dtype>[A-Za-z_.][\w.]*)?")
_INIT = re.compile(r"init\s*=\s*\(")


def from_comment(line: str, where: str) -> ModelConfig:
    """Parse `# fuselens: input=(16384, 1024) float32, input=(1024,) int64 init=(d=64)`."""
    config = ModelConfig()
    match = _INLINE.search(line)
    if not match:
        return config
    body = match.group("body")
    init = _INIT.search(body)
    if init:
        end = _closing_paren(body, init.end() - 1)
        if end < 0:
            raise InputSpecError(f"{where}: init=( has no closing parenthesis")
        config.init = _literal_kwargs(body[init.end():end], where)
        config.init_source = where
        body = body[: init.start()] + body[end + 1:]
    specs = []
    for m in _INPUT.finditer(body):
        dtype = m.group("dtype") or "float32"
        specs.append(InputSpec(parse_shape(m.group("shape"), where), canonical_dtype(dtype, where)))
    if specs:
        config.inputs = specs
        config.inputs_source = where
    elif "input" in body:
        raise InputSpecError(f"{where}: write inputs as input=(16384, 1024) float32")
    return config


def _closing_paren(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return -1


def _literal_kwargs(text: str, where: str) -> dict[str, Any]:
    """`d=64, heads=4` -> {"d": 64, "heads": 4}, values as Python literals only."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError:
        raise InputSpecError(f"{where}: init=(...) must look like init=(d_model=512, heads=8)") from None
    assert isinstance(call, ast.Call)
    if call.args:
        raise InputSpecError(f"{where}: init=(...) takes keyword arguments only")
    out = {}
    for kw in call.keywords:
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            raise InputSpecError(f"{where}: init value for {kw.arg!r} must be a literal") from None
    return out
