"""One resolution of a model's configuration, used by analyze, validate, apply and compare.

Every source a user can give a model's example inputs, constructor arguments and weight
dtype in is read (`contracts/config.py` parses each), and they are weighed here, highest
first:

| source                                   | inputs          | init         | param_dtype |
|------------------------------------------|-----------------|--------------|-------------|
| command line (`--input-shape`, ...)      | whole list (1)  | —            | yes         |
| editor settings (`fuselens.models.<C>`)  | whole list      | key by key   | yes         |
| `[tool.fuselens.models.<C>]` (pyproject) | whole list      | key by key   | yes         |
| `# fuselens:` comment on the class line  | whole list      | key by key   | —           |
| `example_inputs()` (user code)           | whole list (2)  | —            | —           |

Dynamic sizes (`dims`) merge key by key like `init`: `--dim` first, then the editor's, the
pyproject table's and the comment's.  Every size the chosen inputs name must be declared by
one of them, and every declared size must be named by an input; the inputs are then bound
to the middle of each size's corpus (`DimRange.binding`), so the analysis runs at concrete
shapes and the dynamic answers (`pipeline/dynamic.py`) come on top.

(1) for the class `--model-class` names, or for the file's outermost classes without it;
`--dtype` alone re-types the inputs another source gave.  (2) called only when no other
source gives inputs.  Inputs are a list that belongs together, so one source gives all of
them; constructor arguments merge, each key from the highest source that sets it.

Nothing here imports torch or runs user code: `example_inputs()` comes in as a callable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fuselens.contracts.config import (
    INTEGER_DTYPES,
    ConfigError,
    InputSpec,
    ModelConfig,
    ModelSettings,
    canonical_dtype,
    cli_dtypes,
    dims_from_cli,
    from_cli,
    from_comment,
    from_pyproject,
    pyproject_where,
)
from fuselens.contracts.options import AnalyzeOptions

EDITOR = "editor settings"

ExampleInputs = Callable[[], "tuple[list[InputSpec], str] | None"]  # -> (specs, where) or None


@dataclass
class Source:
    """One place that said something about a model, and what it said."""

    where: str
    settings: ModelSettings


@dataclass
class ModelClass:
    """The syntactic facts about a model class the sources are looked up by."""

    name: str  # a class's name, or the variable a model object is bound to
    line: int
    header: str  # the text of the `class` line(s) or the binding, for an inline `# fuselens:` comment
    outermost: bool  # no other class of the file uses it
    aliases: tuple[str, ...] = ()  # other names settings may use for it: a model object's class name


def sources_for(
    model: ModelClass, options: AnalyzeOptions, tool_table: dict[str, Any], pyproject: str | None
) -> list[Source]:
    """Every source that says something about `model`, highest precedence first."""
    sources: list[Source] = []
    cli_inputs = from_cli(options.input_shapes, options.dtypes)
    if cli_inputs is not None and targeted_by_cli(model, options):
        sources.append(Source("--input-shape", ModelSettings(inputs=cli_inputs)))
    if options.dims and targeted_by_cli(model, options):
        sources.append(Source("--dim", ModelSettings(dims=dims_from_cli(options.dims))))
    if options.param_dtype:
        sources.append(Source("--param-dtype", _cli_param_dtype(options.param_dtype)))
    names = (model.name, *model.aliases)
    editor = next((n for n in names if n in options.models), None)
    if editor is not None:
        sources.append(Source(EDITOR, options.models[editor]))
    for name in names:
        project = from_pyproject(tool_table, name, pyproject or "pyproject.toml")
        if project is not None:
            sources.append(Source(pyproject_where(pyproject or "pyproject.toml", name), project))
            break
    where = f"the inline comment on line {model.line}"
    comment = from_comment(model.header, where)
    if comment is not None:
        sources.append(Source(where, comment))
    return sources


def targeted_by_cli(model: ModelClass, options: AnalyzeOptions) -> bool:
    """Command-line inputs are for the class `--model-class` names, else for the outermost ones."""
    return options.model_class == model.name if options.model_class else model.outermost


def _cli_param_dtype(name: str) -> ModelSettings:
    return ModelSettings(param_dtype=canonical_dtype(name, "--param-dtype"))


def resolve(
    sources: list[Source], example_inputs: ExampleInputs | None = None, retype: list[str] | None = None
) -> ModelConfig:
    """The configuration `sources` (highest first) add up to; `retype`: `--dtype` given without shapes."""
    config = ModelConfig()
    for source in sources:
        if source.settings.inputs is not None:
            config.inputs, config.inputs_source = source.settings.inputs, source.where
            break
    else:
        found = example_inputs() if example_inputs is not None else None
        if found is not None:
            config.inputs, config.inputs_source = found
    for source in reversed(sources):
        for key, value in source.settings.init.items():
            config.init[key] = value
            config.init_sources[key] = source.where
    for source in sources:
        if source.settings.param_dtype is not None:
            config.param_dtype, config.param_dtype_source = source.settings.param_dtype, source.where
            break
    if retype and config.inputs:
        dtypes = cli_dtypes(retype, len(config.inputs))
        config.inputs = [
            InputSpec(
                list(spec.shape), dtype, high=spec.high if dtype in INTEGER_DTYPES else None, symbols=spec.symbols
            )
            for spec, dtype in zip(config.inputs, dtypes, strict=True)
        ]
        config.inputs_source += " with --dtype"
    for source in reversed(sources):
        for name, dim in source.settings.dims.items():
            config.dims[name] = dim
            config.dims_sources[name] = source.where
    bind_symbols(config)
    return config


def bind_symbols(config: ModelConfig) -> None:
    """Check that the inputs' named sizes and the declared ones are the same, and give each named size
    of the inputs its analysis binding (ConfigError, naming the source, where they differ)."""
    named = {n for spec in config.inputs or [] for n in spec.named}
    for name in sorted(set(config.dims) - named):
        where = config.dims_sources[name]
        if where != "--dim" and not config.inputs_source.startswith(where):
            # Declared beside other inputs than those chosen (`--input-shape 4,128,1024` over a pyproject
            # table that names `seq`): a range for shapes not analyzed.
            del config.dims[name], config.dims_sources[name]
            continue
        shapes = f"the inputs name {', '.join(sorted(named))}" if named else "the inputs name no size"
        raise ConfigError(
            f"{where}: unknown symbol {name!r}: no input shape names it ({shapes}; from {config.inputs_source})"
        )
    for name in sorted(named - set(config.dims)):
        raise ConfigError(
            f"{config.inputs_source}: the input shape names {name!r}, whose range is not declared: declare it, "
            f"as in dims = {{ {name} = {{ min = 1, max = 8192 }} }}, dims={name}:1..8192 or --dim {name}=1..8192"
        )
    order = list(dict.fromkeys(n for spec in config.inputs or [] for n in spec.symbols if n))
    config.dims = {n: config.dims[n] for n in order}  # as the shapes name them
    config.inputs = [
        dataclasses.replace(
            spec, shape=[config.dims[n].binding if n else d for d, n in zip(spec.shape, spec.symbols, strict=True)]
        )
        if spec.symbols
        else spec
        for spec in config.inputs or []
    ] or config.inputs


def resolve_model(
    model: ModelClass,
    options: AnalyzeOptions,
    tool_table: dict[str, Any],
    pyproject: str | None,
    example_inputs: ExampleInputs | None = None,
) -> ModelConfig:
    """`model`'s configuration from every source (a `ConfigError` names a malformed one)."""
    sources = sources_for(model, options, tool_table, pyproject)
    retype = options.dtypes if not options.input_shapes and targeted_by_cli(model, options) else None
    return resolve(sources, example_inputs, retype)
