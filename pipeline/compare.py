"""The torch.compile comparison: what Inductor fuses, next to what fuselens found.

Slow (Inductor compiles the whole model, seconds per model), so the language server runs
it in the background after the fast analysis has published, and the CLI only with
`--vs-inductor`.  Each model is built exactly as the analysis built it (the same resolved
configuration), compiled, and its kernels matched to our clusters; the comparison goes into
the model's `inductor` field, and Inductor's Triton source for each kernel comes back beside
it, for the editor command that shows it.
"""

from __future__ import annotations

import os

from fuselens.analysis import loader
from fuselens.analysis.inductor import InductorCaptureError, capture_inductor
from fuselens.analysis.inductor_compare import compare_with_inductor
from fuselens.contracts.inductor import ComparisonResult
from fuselens.contracts.options import AnalyzeOptions, Progress, no_progress

from .analyze import AnalyzedFile, analyze


def compare(analyzed: AnalyzedFile, progress: Progress = no_progress) -> dict[str, str]:
    """Fill `model.inductor` for every analyzed model of the file; returns {kernel id: source}."""
    report = analyzed.report
    sources: dict[str, str] = {}
    models = [m for m in report.models if m.status == "analyzed"]
    for index, model in enumerate(models):
        progress(f"torch.compile {model.name}", index / len(models))
        config = analyzed.configs[model.name]
        try:
            built = loader.build_source(
                analyzed.sources[model.name], config.init, analyzed.user_code, config.param_dtype
            )
            # Real buffers (position ids, rotary tables): Inductor's kernels do not depend on weight values,
            # but a model run on garbage indices can fail before it compiles.
            real = built.real()
            # Inductor's ops are placed by the rule ours are: the innermost frame of model code, a
            # library's included, so that a cluster on a library's lines meets the kernels made of them.
            result = capture_inductor(real, loader.meta_inputs(config.inputs or []), analyzed.user_code.model_code)
        except (InductorCaptureError, loader.LoadError) as exc:
            model.inductor_error = str(exc)
            continue
        model.inductor = compare_with_inductor(model, result)
        for kernel in result.kernels():
            sources[kernel.id] = kernel.source
    if models:
        progress("torch.compile comparison done", 1.0)
    return sources


def compare_file(path: str, options: AnalyzeOptions, progress: Progress = no_progress) -> ComparisonResult:
    """Analyze `path` and compare every model with torch.compile."""
    analyzed = analyze(path, options, code=False)  # (matched by lines: no kernel's code is read)
    sources = compare(analyzed, progress)
    report = analyzed.report
    return ComparisonResult(
        os.path.abspath(path),
        report.source_sha256,
        models={m.name: m.inductor for m in report.models},
        errors={m.name: m.inductor_error for m in report.models if m.inductor_error},
        sources=sources,
    )
