"""The kernel module a quick fix writes and a kernel view shows, from a report with its kernels' code."""

from __future__ import annotations

import contextlib

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.codegen.rewrites import Record
from fuselens.contracts.report import Report


def kernel_module_text(report: Report, patched: list[str] | None = None, rewritten: list[Record] | None = None) -> str:
    """The kernel module for `report` (merged with the one on disk), with library patches for the
    clusters `patched` and the records of the rewrites `rewritten`."""
    # Imported here, when a module is first written: the server starts without the module's sections.
    from fuselens.codegen.module import module_for_report

    module_path = next((c.kernel.path for _, c in report.clusters() if c.kernel), None)
    if module_path is None and rewritten:
        module_path = edits_mod.kernel_module_path(report.file)
    existing = None
    if module_path:
        # A file there that is not one to merge with (the user's, a FIFO, one of gigabytes) is left
        # out; whatever would write the module refuses it first, saying why.
        with contextlib.suppress(files.Refused):
            existing = files.check_kernel_module(module_path)
    return module_for_report(report, existing, patched, rewritten)
