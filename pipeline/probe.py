"""Probe a file's models on data: analyze it (which models there are, their configuration and declared
inputs), then run each on the probe's batches with every GEMM call sketched by its site.

Where the batches come from, first found wins: the function `--data` names, `probe-data` in
`[tool.fuselens]` of the nearest pyproject.toml, the file's `probe_batches()`, synthetic inputs of the
declared shapes.  `probe-sample-every` there sets the sampling when the command line does not.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from fuselens.analysis.probe import data
from fuselens.analysis.probe.run import ForwardError, probe_model
from fuselens.contracts.config import ConfigError, InputSpec, find_pyproject, read_tool_table
from fuselens.contracts.options import AnalyzeOptions, Progress, no_progress
from fuselens.contracts.probe import ModelProbe, ProbeOptions, ProbeReport
from fuselens.contracts.report import Model
from fuselens.validate.runner import Subject
from fuselens.validate.specialisations import measure_site

from .analyze import AnalyzedFile, analyze
from .unanalyzed import unanalyzed_models

SETTING_DATA = "probe-data"
SETTING_SAMPLE = "probe-sample-every"


def probe_file(
    path: str, analyze_options: AnalyzeOptions, options: ProbeOptions, progress: Progress = no_progress
) -> ProbeReport:
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = ProbeReport(os.path.abspath(path), device, max(options.sample_every, 1))
    report.versions = {"torch": torch.__version__}
    if device == "cuda" and not torch.cuda.is_available():
        report.problems.append("no CUDA device here: run with --on cpu")
        return report
    try:
        settings = read_tool_table(find_pyproject(path))
        named, sample_every = _settings(settings, options)
    except ConfigError as exc:
        report.problems.append(str(exc))
        return report
    report.sample_every = sample_every
    report.measured_on = device if options.measure else ""
    progress("analyzing", 0.0)
    analyzed = analyze(path, analyze_options)
    for problem in analyzed.report.problems:
        where = f"{problem.file or report.file}:{problem.line}: " if problem.line else ""
        report.problems.append(where + problem.message)
    report.problems += unanalyzed_models(analyzed.report)
    if analyzed.report.problems:
        return report
    try:
        source = _named_source(named, analyzed, path, options)
    except data.DataError as exc:
        report.problems.append(str(exc))
        return report
    models = [m for m in analyzed.report.models if m.status == "analyzed" and m.name in analyzed.sources]
    for index, model in enumerate(models):
        progress(f"{model.name}: probing", 0.1 + 0.9 * index / max(len(models), 1))
        report.models.append(_probe(analyzed, model, source, options, sample_every, device))
    progress("done", 1.0)
    return report


def _settings(table: dict[str, Any], options: ProbeOptions) -> tuple[tuple[str, str] | None, int]:
    """The data function named (and where), and the sampling: the command line's, else the settings'."""
    named = (options.data, "--data") if options.data else None
    configured = table.get(SETTING_DATA)
    if named is None and configured is not None:
        if not isinstance(configured, str):
            raise ConfigError(f'[tool.fuselens] {SETTING_DATA} must be a string such as "pkg.data:batches"')
        named = (configured, f"[tool.fuselens] {SETTING_DATA}")
    sample_every = options.sample_every
    if not sample_every:
        configured = table.get(SETTING_SAMPLE, 1)
        if not isinstance(configured, int) or isinstance(configured, bool) or configured < 1:
            raise ConfigError(f"[tool.fuselens] {SETTING_SAMPLE} must be a whole number of at least 1")
        sample_every = configured
    return named, sample_every


def _named_source(
    named: tuple[str, str] | None, analyzed: AnalyzedFile, path: str, options: ProbeOptions
) -> data.BatchSource | None:
    """The batches every model of the file runs on, or None: each model's synthetic ones."""
    if named is not None:
        search = [os.path.dirname(os.path.abspath(path)), options.working_directory]
        return data.named_function(named[0], named[1], search)
    if analyzed.module is not None:
        return data.file_function(analyzed.module, os.path.basename(path))
    return None


def _probe(
    analyzed: AnalyzedFile,
    model: Model,
    source: data.BatchSource | None,
    options: ProbeOptions,
    sample_every: int,
    device: str,
) -> ModelProbe:
    config = analyzed.configs[model.name]
    if source is None:
        specs = [InputSpec(list(i.shape or []), i.dtype, high=i.high) for i in model.inputs]
        source = data.synthetic(specs, options.synthetic, options.seed)
    subject = Subject(analyzed.sources[model.name], config.init, config.param_dtype)
    try:
        real = subject.real(options.seed, analyzed.user_code).to(device)
        keep = options.batches if options.measure else 0
        probed = probe_model(real, source, options.batches, sample_every, device, analyzed.user_code, keep)
    except (data.DataError, ForwardError) as exc:
        return ModelProbe(model.name, source.description, 0, problem=str(exc))
    if options.measure:
        for site, state in zip(probed.sites, probed.states, strict=True):
            site.measured = measure_site(site, state.kept, state.channel_max)
    return ModelProbe(model.name, source.description, probed.batches, probed.sites)
