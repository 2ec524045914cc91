"""What of a file its analysis could not do, or does not have, one line each: what the steps after it
(validate, apply, profile) say instead of doing nothing quietly.

A model the analysis failed on (its constructor or forward raised, say) is always one.  A model it
skipped (no example inputs; a block analyzed inside the model that holds it) is one only when no model
of the file was analyzed: a file's submodules are skipped as a matter of course.
"""

from __future__ import annotations

import os

from fuselens.codegen.edits import natural_order
from fuselens.contracts.report import Model, Report


def unanalyzed_models(report: Report) -> list[str]:
    """A line for each model of `report` that was not analyzed and should have been, saying why."""
    failed = [_line(m) for m in report.models if m.status == "error"]
    if any(m.status == "analyzed" for m in report.models):
        return failed
    if not report.models and not report.problems:
        return [
            f"no models found in {os.path.basename(report.file)} (nn.Module classes, or model objects bound at module level)"
        ]
    return failed + [_line(m) for m in report.models if m.status == "skipped"]


def _line(model: Model) -> str:
    problem = model.problem
    if problem is None:
        return f"{model.name}: not analyzed"
    message = problem.message if problem.message.startswith(f"{model.name}:") else f"{model.name}: {problem.message}"
    where = f" ({os.path.basename(problem.file)}:{problem.line})" if problem.file and problem.line else ""
    hint = f"; {problem.hint}" if problem.hint and model.status == "skipped" else ""
    return f"{message}{where}{hint}"


def no_such_clusters(report: Report, cluster_ids: list[str]) -> str:
    """What to say when `cluster_ids` names clusters `report` does not have."""
    have = list(dict.fromkeys(c.id for _, c in report.clusters()))
    have += [r.id for _, _, r in report.rewrites()]
    missing = ", ".join(sorted(set(cluster_ids) - set(have), key=natural_order))
    there = f"its clusters: {', '.join(have)}" if have else "it has none"
    return f"no cluster {missing} in {os.path.relpath(report.file)} ({there})"
