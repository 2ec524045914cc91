"""Profile a file's models: analyze it, then run each model's forward under the profiler and
attribute the measured time to its lines, its clusters and its opaque ops.

The models profiled are the ones the analysis built, with the configuration it resolved, given
real seeded weights and random inputs of the analysed shapes on the chosen device.

A file `fuselens apply` edited is also profiled as it was before the edit (the code its kernel
module keeps), in the same run: each applied kernel's measured time is set beside the time the cost
model predicted for it from its cluster's measured time before, and the model's error is given per
cluster kind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from statistics import mean

import torch

from fuselens.analysis import capture, loader, packages
from fuselens.codegen import edits, files
from fuselens.contracts.config import InputSpec
from fuselens.contracts.options import AnalyzeOptions, ProfileOptions, Progress, no_progress
from fuselens.contracts.profile import AppliedTime, ModelProfile, Profile
from fuselens.contracts.report import Model, Report
from fuselens.contracts.validation import NO_CUDA
from fuselens.profiling.attribute import attribute
from fuselens.profiling.measure import measure
from fuselens.validate.runner import Subject

from .analyze import AnalyzedFile, analyze
from .profile_shapes import CPU_FORWARD_BYTES, TooLarge, cpu_shapes
from .profile_sizes import Seen, recording_sizes

ANALYZED = 0.1  # the fraction of a profile's progress its analysis stands for


def _within(progress: Progress, prefix: str, start: float, span: float) -> Progress:
    """`progress` for one part of the job, from `start` to `start + span` of the whole: each note
    `prefix`ed, its fraction of the part turned into one of the whole."""

    def report(message: str, fraction: float | None = None) -> None:
        progress(prefix + message, None if fraction is None else start + span * min(max(fraction, 0.0), 1.0))

    return report


def profile_file(
    path: str, analyze_options: AnalyzeOptions, options: ProfileOptions, progress: Progress = no_progress
) -> Report:
    """The analysis report of `path`, with its `profile` section measured."""
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():  # said at once: the caller may take it elsewhere
        report = Report(os.path.abspath(path), "")
        report.profile = Profile("cuda", "", options.iterations, options.warmup, problems=[NO_CUDA])
        return report
    progress("analyzing", 0.0)
    analyzed = analyze(path, analyze_options)
    profile = Profile(
        mode=device,
        device=torch.cuda.get_device_name() if cuda else "cpu",
        iterations=options.iterations,
        warmup=options.warmup,
        step="training step" if options.train else "forward",
        versions={"torch": torch.__version__} | ({"cuda": str(torch.version.cuda)} if cuda else {}),
    )
    kernel_module = edits.kernel_module_path(path, analyze_options.out_dir)
    models = [m for m in analyzed.report.models if m.status == "analyzed" and m.name in analyzed.sources]
    before = _code_before_apply(path, analyzed.text, kernel_module)
    # After the analysis, an equal part of what is left for each model's profile (and, in an applied
    # file, for its profile before apply): the fraction moves with every forward.
    parts = max(len(models), 1) * (2 if before is not None else 1)
    part = (1.0 - ANALYZED) / parts
    dynamic = {analyzed.sources[m.name].cls: m for m in models if m.dynamic is not None}
    seen: Seen = {}
    for index, model in enumerate(models):
        within = _within(progress, f"{model.name}: ", ANALYZED + index * part, part)
        recorder = (dynamic, seen)
        profile.models.append(
            _profile_model(analyzed, model, device, options, kernel_module, progress=within, recorder=recorder)
        )
    for profiled in profile.models:
        profiled.sizes_seen = {size: sorted(values) for size, values in seen.get(profiled.name, {}).items()}
    if before is not None:
        start = ANALYZED + len(models) * part
        progress("analyzing the code before apply", start)
        earlier = analyze(path, dataclasses.replace(analyze_options, source_text=before))
        originals = {m.name: m for m in earlier.report.models if m.status == "analyzed" and m.name in earlier.sources}
        for index, after in enumerate(profile.models):
            original = originals.get(after.name)
            if original is not None and not after.problem:
                # At the shapes the code as it is now ran at: the two are compared.
                shapes = (after.inputs, after.cpu_budget_bytes)
                within = _within(progress, f"{after.name} before apply: ", start + index * part, part)
                _compare_with(
                    after, _profile_model(earlier, original, device, options, kernel_module, shapes, within), original
                )
    progress("done", 1.0)
    analyzed.report.profile = profile
    # The profile's lines name libraries' files no cluster is in (a GEMM's line in a modeling file).
    lines = [line.file for m in profile.models for line in m.lines]
    known = {(library.name, library.root) for library in analyzed.report.libraries}
    analyzed.report.libraries += [
        library for library in packages.libraries(lines, path) if (library.name, library.root) not in known
    ]
    return analyzed.report


def _profile_model(
    analyzed: AnalyzedFile,
    model: Model,
    device: str,
    options: ProfileOptions,
    kernel_module: str,
    shapes: tuple[list[list[int]], int | None] | None = None,
    progress: Progress = no_progress,
    recorder: tuple[dict[type, Model], Seen] | None = None,
) -> ModelProfile:
    """`model` profiled at its analyzed inputs, or at `shapes` (the input shapes, and the CPU's budget
    they were chosen for), or on a CPU by default at smaller ones (`profile_shapes.py`); with `recorder`
    (the models with dynamic sizes by class, and what was seen), the sizes their calls see are recorded."""
    config = analyzed.configs[model.name]
    subject = Subject(analyzed.sources[model.name], config.init, config.param_dtype)
    specs = [InputSpec(list(i.shape or []), i.dtype, high=i.high) for i in model.inputs]
    names = [i.name or f"input{k}" for k, i in enumerate(model.inputs)]
    budget = None
    if shapes is not None:
        specs = [dataclasses.replace(spec, shape=list(shape)) for spec, shape in zip(specs, shapes[0], strict=True)]
        budget = shapes[1]
    elif device == "cpu" and not options.full_size:
        progress("choosing inputs a CPU profiles within its budget", 0.0)
        try:
            specs = cpu_shapes(subject, specs, names, analyzed.user_code)
        except TooLarge as exc:
            return ModelProfile(model.name, 0.0, 0.0, 0.0, problem=str(exc))
        budget = CPU_FORWARD_BYTES
    try:
        real = subject.real(options.seed, analyzed.user_code).to(device)
        if options.train:
            real.train()
        inputs = loader.random_inputs(specs, device, options.seed)
        decisions = model.paths[0] if model.paths else []
        recording = recording_sizes(real, *recorder) if recorder else contextlib.nullcontext()
        with _refusals(kernel_module) as refused, recording:
            measured = measure(
                real,
                inputs,
                names,
                analyzed.user_code,
                decisions,
                options.iterations,
                options.warmup,
                options.train,
                progress,
            )
    except (capture.CaptureError, RuntimeError) as exc:
        return ModelProfile(model.name, 0.0, 0.0, 0.0, problem=f"the forward could not be profiled: {exc}")
    progress("attributing the measured time", 1.0)
    profiled = attribute(model, measured, os.path.abspath(analyzed.report.file), kernel_module)
    profiled.inputs = [list(spec.shape) for spec in specs]
    profiled.cpu_budget_bytes = budget
    # A kernel whose `fits` said no ran the lines it stands in for, as written: it did not run here.
    profiled.fell_back = sorted(set(profiled.fell_back) | (refused - set(profiled.kernels)))
    return profiled


@contextlib.contextmanager
def _refusals(kernel_module: str) -> Iterator[set[str]]:
    """The kernels of the loaded `kernel_module` whose `fits` answers no while the block runs."""
    refused: set[str] = set()
    module = next(
        (m for m in list(sys.modules.values()) if _same_file(getattr(m, "__file__", None), kernel_module)), None
    )
    watched = [(name, f) for name, f in vars(module).items() if callable(getattr(f, "fits", None))] if module else []

    def watching(name: str, fits: Callable[..., bool]) -> Callable[..., bool]:
        def watched_fits(*args: object, **kwargs: object) -> bool:
            answer = fits(*args, **kwargs)
            if not answer:
                refused.add(name)
            return answer

        return watched_fits

    originals = [(f, f.fits) for _, f in watched]
    for name, f in watched:
        f.fits = watching(name, f.fits)
    try:
        yield refused
    finally:
        for f, fits in originals:
            f.fits = fits


def _same_file(a: str | None, b: str) -> bool:
    return bool(a) and os.path.abspath(a or "") == os.path.abspath(b)


def _code_before_apply(path: str, text: str, kernel_module: str) -> str | None:
    """`text` with every applied kernel's call replaced by the code it replaced (None: nothing applied)."""
    try:
        module_text = files.check_kernel_module(kernel_module)
    except files.Refused:
        return None  # a module fuselens did not write: it keeps no code of this file
    if module_text is None:
        return None
    plan = edits.restore_edits(text, path, kernel_module, module_text, None)
    return edits.apply_line_edits(text, plan.edits) if plan.edits else None


def _compare_with(after: ModelProfile, before: ModelProfile, model: Model) -> None:
    """Each kernel `after` calls, against its cluster in `before` (the code before apply, `model` its
    report): measured now, and predicted then."""
    after.before_us = before.forward_us
    for kernel, us in after.kernels.items():
        cluster = next((c for c in model.clusters if c.kernel is not None and c.kernel.name == kernel), None)
        timed = next((t for t in before.clusters if cluster is not None and t.id == cluster.id), None)
        if cluster is None or timed is None or us <= 0:
            continue
        after.applied.append(
            AppliedTime(
                kernel=kernel,
                cluster=cluster.id,
                kind=cluster.kind,
                unfused_us=timed.us,
                predicted_fused_us=timed.predicted_fused_us,
                measured_us=us,
                error=round(timed.predicted_fused_us / us - 1, 4),
                reference=kernel in after.fell_back,
            )
        )
    kinds = sorted({a.kind for a in after.applied if not a.reference})
    after.cost_model_error = {
        kind: round(mean(a.error for a in after.applied if a.kind == kind and not a.reference), 4) for kind in kinds
    }
