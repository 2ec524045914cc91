"""Validate a file's kernels: analyze it, then check every kernel of the report against eager.

The analysis and the validation see the same models: the classes the analysis imported
from the text it was given (an editor buffer, or the file), built with the configuration it
resolved for each of them.
"""

from __future__ import annotations

from fuselens.contracts.options import AnalyzeOptions, Progress, ValidateOptions, no_progress
from fuselens.contracts.validation import ValidationReport
from fuselens.validate import runner

from .analyze import AnalyzedFile, analyze
from .unanalyzed import no_such_clusters, unanalyzed_models


def validate_file(
    path: str, analyze_options: AnalyzeOptions, options: ValidateOptions, progress: Progress = no_progress
) -> ValidationReport:
    """The validation of `path`'s kernels; its problems say what could not be validated and why: the
    clusters asked for that the file does not have, and each model the analysis failed on (or, when it
    analyzed none, each it skipped)."""
    with runner.kernel_environment(options):
        return _validate_file(path, analyze_options, options, progress)


def _validate_file(
    path: str, analyze_options: AnalyzeOptions, options: ValidateOptions, progress: Progress
) -> ValidationReport:
    result = runner.start(path, options)
    if result.problems:
        return result
    progress("analyzing", 0.0)
    analyzed = analyze(path, analyze_options)
    known = {c.id for _, c in analyzed.report.clusters()} | {r.id for _, _, r in analyzed.report.rewrites()}
    if options.clusters and set(options.clusters) - known:
        result.problems.append(no_such_clusters(analyzed.report, options.clusters))
        return result
    validated = validate_analyzed(result, analyzed, options, progress)
    if not analyzed.report.problems:
        validated.problems += unanalyzed_models(analyzed.report)
    return validated


def validate_analyzed(
    result: ValidationReport, analyzed: AnalyzedFile, options: ValidateOptions, progress: Progress = no_progress
) -> ValidationReport:
    """Check the kernels of a file already analyzed, into `result` (from `runner.start`)."""
    subjects = {
        name: runner.Subject(source, analyzed.configs[name].init, analyzed.configs[name].param_dtype)
        for name, source in analyzed.sources.items()
    }
    return runner.validate_report(
        result, analyzed.report, analyzed.text, subjects, analyzed.user_code, options, progress
    )
