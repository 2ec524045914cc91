"""The torch.compile comparison job: what Inductor fuses, next to what fuselens found.

Slow (Inductor compiles the whole model, seconds per model), so the language server runs
it in the background after the fast analysis has published, and the CLI only with
`--vs-inductor`.  The comparison goes into each model's `inductor` field of the report;
Inductor's Triton source for each of its kernels comes back beside the report, for the
editor command that shows it.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from fuselens.analysis import capture, loader
from fuselens.analysis.inductor import InductorCaptureError, capture_inductor
from fuselens.analysis.inductor_compare import compare_with_inductor
from fuselens.analysis.report import Report

Progress = Callable[[str, float | None], None]


def compare_report(report: Report, options, progress: Progress | None = None) -> dict[str, str]:
    """Fill `model.inductor` for every analysed model of `report`; returns {kernel id: source}."""
    progress = progress or (lambda message, fraction=None: None)
    user_code = capture.UserCode()
    sources: dict[str, str] = {}
    models = [m for m in report.models if m.status == "analysed"]
    if not models:
        return sources
    module = loader.import_file(report.file, user_code, options.source_text)
    classes = loader.model_classes(module)
    from fuselens.worker.analyze import _config  # the same example inputs and weights as the analysis
    from fuselens.analysis import discover, inputs as inputs_mod

    text = options.source_text or open(report.file, encoding="utf-8").read()
    infos = {c.name: c for c in discover.find_classes(text)}
    table = inputs_mod.read_tool_table(inputs_mod.find_pyproject(report.file))
    top = {c.name for c in discover.top_level(list(infos.values()))}
    for index, model in enumerate(models):
        progress(f"torch.compile {model.name}", index / len(models))
        try:
            config = _config(infos[model.name], classes[model.name], module, table, top, options, report.file,
                             user_code)
            built = loader.build(classes[model.name], config.init, user_code, "")
            if config.param_dtype:
                import torch

                built.model.to(getattr(torch, config.param_dtype))
            result = capture_inductor(built.model, loader.meta_inputs(config.inputs), user_code)
        except (InductorCaptureError, loader.LoadError) as exc:
            model.inductor_error = str(exc)
            continue
        model.inductor = compare_with_inductor(model, result)
        for kernel in result.kernels():
            sources[kernel.id] = kernel.source
    progress("torch.compile comparison done", 1.0)
    return sources


def comparison_job(path: str, options, progress: Progress) -> dict[str, Any]:
    from fuselens.worker.analyze import analyze_file

    report = analyze_file(path, options)
    sources = compare_report(report, options, progress)
    return {"models": {m.name: (m.inductor.to_dict() if m.inductor else None) for m in report.models},
            "errors": {m.name: m.inductor_error for m in report.models if m.inductor_error},
            "sources": sources, "file": os.path.abspath(path), "source_sha256": report.source_sha256}
