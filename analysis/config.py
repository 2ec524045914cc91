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

(1) for the class `--model-class` names, or for the file's outermost classes without it;
`--dtype` alone re-types the inputs another source gave.  (2) called only when no other
source gives inputs.  Inputs are a list that belongs together, so one source gives all of
them; constructor arguments merge, each key from the highest source that sets it.

Nothing here imports torch or runs user code: `example_inputs()` comes in as a callable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fuselens.contracts.config import (
    INTEGER_DTYPES,
    InputSpec,
    ModelConfig,
    ModelSettings,
    canonical_dtype,
    cli_dtypes,
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
            InputSpec(list(spec.shape), dtype, high=spec.high if dtype in INTEGER_DTYPES else None)
            for spec, dtype in zip(config.inputs, dtypes, strict=True)
        ]
        config.inputs_source += " with --dtype"
    return config


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
