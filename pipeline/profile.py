"""Profile a file's models: analyze it, then run each model's forward under the profiler and
attribute the measured time to its lines, its clusters and its opaque ops.

The models profiled are the ones the analysis built, with the configuration it resolved, given
real seeded weights and random inputs of the analysed shapes on the chosen device.
"""

from __future__ import annotations

import os

import torch

from fuselens.analysis import capture, loader
from fuselens.contracts.config import InputSpec
from fuselens.contracts.options import AnalyzeOptions, ProfileOptions, Progress, no_progress
from fuselens.contracts.profile import ModelProfile, Profile
from fuselens.contracts.report import Model, Report
from fuselens.profiling.attribute import attribute
from fuselens.profiling.measure import measure
from fuselens.validate.runner import Subject

from .analyze import AnalyzedFile, analyze


def profile_file(
    path: str, analyze_options: AnalyzeOptions, options: ProfileOptions, progress: Progress = no_progress
) -> Report:
    """The analysis report of `path`, with its `profile` section measured."""
    progress("analyzing", 0.0)
    analyzed = analyze(path, analyze_options)
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device == "cuda"
    profile = Profile(
        mode=device,
        device=torch.cuda.get_device_name() if cuda else "cpu",
        iterations=options.iterations,
        warmup=options.warmup,
        versions={"torch": torch.__version__} | ({"cuda": str(torch.version.cuda)} if cuda else {}),
    )
    models = [m for m in analyzed.report.models if m.status == "analyzed" and m.name in analyzed.sources]
    for index, model in enumerate(models):
        progress(f"profiling {model.name}", index / max(len(models), 1))
        profile.models.append(_profile_model(analyzed, model, device, options))
    progress("done", 1.0)
    analyzed.report.profile = profile
    return analyzed.report


def _profile_model(analyzed: AnalyzedFile, model: Model, device: str, options: ProfileOptions) -> ModelProfile:
    config = analyzed.configs[model.name]
    subject = Subject(analyzed.sources[model.name], config.init, config.param_dtype)
    specs = [InputSpec(list(i.shape or []), i.dtype) for i in model.inputs]
    names = [i.name or f"input{k}" for k, i in enumerate(model.inputs)]
    try:
        real = subject.real(options.seed, analyzed.user_code).to(device)
        inputs = loader.random_inputs(specs, device, options.seed)
        decisions = model.paths[0] if model.paths else []
        measured = measure(real, inputs, names, analyzed.user_code, decisions, options.iterations, options.warmup)
    except (capture.CaptureError, RuntimeError) as exc:
        return ModelProfile(model.name, 0.0, 0.0, 0.0, problem=f"the forward could not be profiled: {exc}")
    return attribute(model, measured, os.path.abspath(analyzed.report.file))
