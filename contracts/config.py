"""What a user tells fuselens about a model, and how each place they can say it is read.

A model's configuration is its example inputs (shapes and dtypes), its constructor arguments
(`init`), the dtype to cast its weights to (`param_dtype`) and the ranges of the sizes its
input shapes name (`dims`: `dims.py`).  A user can give them in four
places; each is parsed here into the same `ModelSettings`, as plain data (nothing is
evaluated, no torch):

- the command line: `--input-shape 2,128 --dtype int64 --param-dtype bfloat16 --dim seq=1..8192`;
- the editor's settings: `fuselens.models.<Class>` = `{inputs, dtype, init, param_dtype, dims}`;
- `[tool.fuselens.models.<Class>]` in the nearest `pyproject.toml`, with the same keys;
- a comment on the class line: `# fuselens: input=(16384, 1024) float32 init=(dim=64)`, or with a
  dynamic size `# fuselens: input=(4, seq, 1024) dims=seq:1..8192@1,128,2048,8192`.

A fifth, `example_inputs()` on the model or in its module, is user code: the loader calls it
in the worker.  Which source wins is decided in one place, `analysis/config.py`, and the
result is a `ModelConfig` that says where each value came from.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from .dims import DimError, DimRange, dims_table, parse_dims
from .reading import read_text

MAX_PYPROJECT_BYTES = 1 << 20  # far above any project's pyproject.toml; a larger one is not read

DTYPES = {
    "float32",
    "float",
    "float16",
    "half",
    "bfloat16",
    "float64",
    "double",
    "int64",
    "long",
    "int32",
    "int",
    "int16",
    "int8",
    "uint8",
    "bool",
}
_CANONICAL = {"float": "float32", "half": "float16", "double": "float64", "long": "int64", "int": "int32"}
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
SETTINGS_KEYS = ("inputs", "dtype", "init", "param_dtype", "dims")


class ConfigError(ValueError):
    """A malformed model configuration; the message names where it came from."""


@dataclass
class InputSpec:
    shape: list[int]
    dtype: str = "float32"
    # False when the source gave a shape only: a model that starts by looking up token ids takes int64
    # then, any other float32.
    dtype_given: bool = True
    # An integer input's values are drawn from [0, high): token ids over a vocabulary of `high`, so
    # that lookups read rows all over the table, as a real batch's do.  None: [0, 16), which any
    # table accepts.
    high: int | None = None
    # The size each dimension is declared as (`"seq"`), None for a fixed one; [] when every one is
    # fixed.  `shape` holds the analysis binding of each named size once it is bound (`bind_symbols`).
    symbols: list[str | None] = field(default_factory=list)

    def describe(self) -> str:
        values = f" in [0, {self.high})" if self.high is not None else ""
        dims = [
            f"{n}={d}" if n else str(d)
            for d, n in zip(self.shape, self.symbols or [None] * len(self.shape), strict=True)
        ]
        return f"({', '.join(dims)}) {self.dtype}{values}"

    @property
    def named(self) -> set[str]:
        """The sizes this input's shape names."""
        return {n for n in self.symbols if n}


@dataclass
class ModelSettings:
    """What one source says about one model class; None / empty where it says nothing."""

    inputs: list[InputSpec] | None = None
    init: dict[str, Any] = field(default_factory=dict)
    param_dtype: str | None = None
    dims: dict[str, DimRange] = field(default_factory=dict)  # the ranges of named sizes, by name


@dataclass
class ModelConfig:
    """A model's configuration after every source has been weighed, and where each part came from."""

    inputs: list[InputSpec] | None = None
    inputs_source: str = ""
    init: dict[str, Any] = field(default_factory=dict)
    init_sources: dict[str, str] = field(default_factory=dict)  # constructor argument -> where it came from
    param_dtype: str | None = None  # cast the model's parameters (e.g. "bfloat16")
    param_dtype_source: str = ""
    dims: dict[str, DimRange] = field(default_factory=dict)  # the inputs' named sizes, every one declared
    dims_sources: dict[str, str] = field(default_factory=dict)  # size name -> where its range came from


def canonical_dtype(name: str, where: str) -> str:
    name = name.strip().removeprefix("torch.")
    if name not in DTYPES:
        raise ConfigError(f"{where}: unknown dtype {name!r} (use one of {', '.join(sorted(DTYPES))})")
    return _CANONICAL.get(name, name)


def parse_shape(text: str, where: str) -> list[int]:
    shape, symbols = parse_symbolic_shape(text, where)
    if symbols:
        raise ConfigError(f"{where}: shape {text!r} must be integers like 16384,1024")
    return shape


def parse_symbolic_shape(text: str, where: str) -> tuple[list[int], list[str | None]]:
    """`16384,1024` or `4,seq,1024`: the sizes (0 for a named one, until bound) and the names ([]: none)."""
    parts = [p for p in re.split(r"[,\s]+|(?<=\d)[x×](?=\d)", text.strip().strip("()[]")) if p]
    shape: list[int] = []
    symbols: list[str | None] = []
    for part in parts:
        if part.isidentifier():
            shape.append(0)
            symbols.append(part)
            continue
        try:
            shape.append(int(part))
        except ValueError:
            raise ConfigError(
                f"{where}: shape {text!r} must be integers like 16384,1024, or name a dynamic size: 4,seq,1024"
            ) from None
        symbols.append(None)
    if any(d < 0 for d in shape):
        raise ConfigError(f"{where}: shape {text!r} has a negative size")
    return shape, symbols if any(symbols) else []


# ---- the command line ----------------------------------------------------------------------


def from_cli(shapes: list[str] | None, dtypes: list[str] | None) -> list[InputSpec] | None:
    """`--input-shape` values with their `--dtype`s (one for all, or one per shape)."""
    if not shapes:
        return None
    specs = []
    for text, dtype in zip(shapes, cli_dtypes(dtypes, len(shapes)), strict=True):
        shape, symbols = parse_symbolic_shape(text, "--input-shape")
        specs.append(InputSpec(shape, dtype, dtype_given=bool(dtypes), symbols=symbols))
    return specs


def dims_from_cli(values: list[str] | None) -> dict[str, DimRange]:
    """`--dim seq=1..8192@1,128,2048,8192` values, by name."""
    out: dict[str, DimRange] = {}
    for text in values or []:
        out.update(_checked_dims(text, "--dim", "="))
    return out


def _checked_dims(text: str, where: str, separator: str) -> dict[str, DimRange]:
    try:
        return parse_dims(text, where, separator)
    except DimError as exc:
        raise ConfigError(str(exc)) from None


def cli_dtypes(dtypes: list[str] | None, count: int) -> list[str]:
    """`--dtype` values spread over `count` inputs."""
    dtypes = dtypes or ["float32"]
    if len(dtypes) not in (1, count):
        raise ConfigError(f"--dtype: give one dtype, or one per --input-shape ({count})")
    canonical = [canonical_dtype(d, "--dtype") for d in dtypes]
    return canonical * count if len(canonical) == 1 else canonical


# ---- settings entries: the editor's and pyproject.toml's --------------------------------------


def model_settings(entry: Any, where: str) -> ModelSettings:
    """`{inputs, dtype, init, param_dtype}` (a pyproject table or an editor setting) as `ModelSettings`."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a table of {', '.join(SETTINGS_KEYS)}")
    unknown = sorted(set(entry) - set(SETTINGS_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(SETTINGS_KEYS)})"
        )
    settings = ModelSettings()
    dtype = entry.get("dtype")
    if dtype is not None and not isinstance(dtype, str):
        raise ConfigError(f'{where}.dtype must be a dtype name such as "bfloat16"')
    if "inputs" in entry:
        settings.inputs = _inputs(entry["inputs"], dtype, where)
    elif "dtype" in entry:
        raise ConfigError(f"{where}.dtype is the dtype of `inputs`, which are not given")
    if "init" in entry:
        if not isinstance(entry["init"], dict):
            raise ConfigError(f"{where}.init must be a table of constructor keyword arguments")
        settings.init = dict(entry["init"])
    if "dims" in entry:
        try:
            settings.dims = dims_table(entry["dims"], where)
        except DimError as exc:
            raise ConfigError(str(exc)) from None
    if entry.get("param_dtype") is not None:
        if not isinstance(entry["param_dtype"], str):
            raise ConfigError(f'{where}.param_dtype must be a dtype name such as "bfloat16"')
        settings.param_dtype = canonical_dtype(entry["param_dtype"], f"{where}.param_dtype")
    return settings


def _inputs(value: Any, default_dtype: str | None, where: str) -> list[InputSpec]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}.inputs must be a list of shapes, e.g. [[16384, 1024]]")
    if all(isinstance(v, (int, str)) for v in value):  # a single shape written flat
        value = [value]
    specs = []
    for i, item in enumerate(value):
        here = f"{where}.inputs[{i}]"
        if isinstance(item, dict):
            if not isinstance(item.get("shape"), list):
                raise ConfigError(f"{here} needs a 'shape' list")
            unknown = sorted(set(item) - {"shape", "dtype", "high"})
            if unknown:
                raise ConfigError(f"{here}: unknown key {unknown[0]!r} (known: shape, dtype, high)")
            dtype = item.get("dtype", default_dtype)
            spec = _spec(*_shape_list(item["shape"], here), None if dtype is None else str(dtype), here)
            if "high" in item:
                spec.high = _high(item["high"], spec, here)
            specs.append(spec)
        elif isinstance(item, list):
            specs.append(_spec(*_shape_list(item, here), default_dtype, where))
        else:
            raise ConfigError(f'{here} must be a shape list or {{shape = [...], dtype = "..."}}')
    return specs


def _spec(shape: list[int], symbols: list[str | None], dtype: str | None, where: str) -> InputSpec:
    """A shape and its dtype; with no dtype, float32 until the model says it takes token ids."""
    if dtype is None:
        return InputSpec(shape, "float32", dtype_given=False, symbols=symbols)
    return InputSpec(shape, canonical_dtype(dtype, where), symbols=symbols)


def _high(value: Any, spec: InputSpec, where: str) -> int:
    """An integer input's bound: its values are drawn from [0, high)."""
    if spec.dtype not in INTEGER_DTYPES:
        raise ConfigError(f'{where}.high bounds an integer input\'s values; give it a dtype such as "int64"')
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}.high must be a positive integer (the values are drawn from [0, high))")
    return value


def _shape_list(value: list[Any], where: str) -> tuple[list[int], list[str | None]]:
    """A shape list of sizes and size names (`["batch", "seq", 4096]`): (sizes, names) as `InputSpec`'s."""
    for v in value:
        if isinstance(v, str) and not v.isidentifier():
            raise ConfigError(f'{where}: {v!r} is not a size name (letters, digits, _), as in ["batch", "seq", 4096]')
        if not isinstance(v, str) and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise ConfigError(f"{where}: shape must be a list of non-negative integers and size names")
    symbols: list[str | None] = [v if isinstance(v, str) else None for v in value]
    return [0 if isinstance(v, str) else v for v in value], symbols if any(symbols) else []


# ---- pyproject.toml --------------------------------------------------------------------------


def find_pyproject(path: str) -> str | None:
    """The nearest `pyproject.toml` in the folders above `path`."""
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
    """`[tool.fuselens]` of a pyproject.toml ({} without one); ConfigError, naming the file and why, for
    one that cannot be read: not a regular file (a FIFO would block the reader), larger than
    MAX_PYPROJECT_BYTES, not UTF-8, not TOML, or nested too deeply for the TOML parser."""
    if not pyproject:
        return {}
    try:
        data = tomllib.loads(read_text(pyproject, MAX_PYPROJECT_BYTES))
    except OSError as exc:  # (Unreadable is one)
        raise ConfigError(f"{pyproject} was not read: {exc}") from None
    except ValueError as exc:  # TOMLDecodeError, or an integer longer than Python reads
        raise ConfigError(f"{pyproject} was not read: it is not valid TOML ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{pyproject} was not read: its arrays or tables are nested too deeply") from None
    tool = data.get("tool", {})
    table = tool.get("fuselens", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.fuselens] must be a table")
    return table


def pyproject_where(pyproject: str, class_name: str) -> str:
    return f"{os.path.basename(pyproject)} [tool.fuselens.models.{class_name}]"


def from_pyproject(table: dict[str, Any], class_name: str, pyproject: str) -> ModelSettings | None:
    """`[tool.fuselens.models.<class_name>]`, or None when the table has no entry for it."""
    models = table.get("models", {})
    if not isinstance(models, dict):
        raise ConfigError(f"{os.path.basename(pyproject)} [tool.fuselens.models] must be a table")
    if class_name not in models:
        return None
    return model_settings(models[class_name], pyproject_where(pyproject, class_name))


# ---- inline comments -------------------------------------------------------------------------

_INLINE = re.compile(r"#\s*fuselens:\s*(?P<body>.*)$")
_INPUT = re.compile(r"input\s*=\s*\(\s*(?P<shape>[^)]*)\)\s*(?P<dtype>[A-Za-z_.][\w.]*)?")
_INIT = re.compile(r"init\s*=\s*\(")
_DIMS = re.compile(r"dims\s*=\s*(?P<value>\S+)")
_SHAPE = re.compile(r"\(\s*\d[^)]*\)\s*[\w.]*")


def from_comment(line: str, where: str) -> ModelSettings | None:
    """Parse `# fuselens: input=(16384, 1024) float32, input=(1024,) int64 init=(d=64)`, and dynamic sizes
    `input=(4, seq, 1024) dims=seq:1..8192@1,128,2048,8192` (several: `dims=batch:1..64;seq:1..8192`);
    None without one."""
    match = _INLINE.search(line)
    if not match:
        return None
    settings = ModelSettings()
    body = match.group("body")
    init = _INIT.search(body)
    if init:
        end = _closing_paren(body, init.end() - 1)
        if end < 0:
            raise ConfigError(f"{where}: init=( has no closing parenthesis")
        settings.init = _literal_kwargs(body[init.end() : end], where)
        body = body[: init.start()] + body[end + 1 :]
    for dims in _DIMS.finditer(body):
        for name, dim in _checked_dims(dims.group("value"), where, ":").items():
            if name in settings.dims:
                raise ConfigError(f"{where}: {name} is declared twice")
            settings.dims[name] = dim
    body = _DIMS.sub("", body)
    specs = []
    for m in _INPUT.finditer(body):
        specs.append(_spec(*parse_symbolic_shape(m.group("shape"), where), m.group("dtype"), where))
    stray = _SHAPE.search(_INPUT.sub("", body))
    if stray:  # `input=(8, 64), (8, 64)`: a shape without its `input=` would be dropped
        raise ConfigError(
            f"{where}: `{stray.group(0).strip()}` has no `input=`: write each input as input=(...) dtype, "
            "as in input=(8, 64) float32, input=(8, 64) float32"
        )
    if specs:
        settings.inputs = specs
    elif "input" in body:
        raise ConfigError(f"{where}: write inputs as input=(16384, 1024) float32")
    return settings


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
        raise ConfigError(f"{where}: init=(...) must look like init=(d_model=512, heads=8)") from None
    if not isinstance(call, ast.Call) or call.args or any(kw.arg is None for kw in call.keywords):
        raise ConfigError(f"{where}: init=(...) takes keyword arguments only")
    out = {}
    for kw in call.keywords:
        try:
            out[str(kw.arg)] = ast.literal_eval(kw.value)
        except ValueError:
            raise ConfigError(f"{where}: init value for {kw.arg!r} must be a literal") from None
    return out
