"""`fuselens apply`: write the kernel module and replace each exactly-mapped cluster's lines.

The edits are computed from the text that was analysed; if the file changes on disk
before we write (an editor saved, say), nothing is written.
"""

from __future__ import annotations

import difflib
import os

from rich.console import Console
from rich.syntax import Syntax

from fuselens.codegen import edits as edits_mod


def run_apply(args, analyze_options) -> int:
    from fuselens.worker.analyze import analyze_file, kernel_module_text

    console = Console()
    with open(args.file, encoding="utf-8") as fh:
        source = fh.read()
    analyze_options.source_text = source
    report = analyze_file(args.file, analyze_options)
    for problem in report.problems:
        console.print(f"[bold red]error[/] {problem.file}:{problem.line} {problem.message}")
    if report.problems:
        return 1
    wanted = args.cluster
    exact = [c for _, c in report.clusters() if c.edit and (not wanted or c.id in wanted)]
    skipped = [c for _, c in report.clusters() if c.edit is None and (not wanted or c.id in wanted)]
    for c in skipped:
        console.print(f"[yellow]skip[/] {c.id} ({c.op_chain}): mapping is {c.mapping}: {c.mapping_detail}")
    if not exact:
        console.print("nothing to apply: no cluster maps exactly onto its lines")
        return 1 if wanted else 0
    new_source = edits_mod.apply_line_edits(source, edits_mod.cluster_edits(source, report, [c.id for c in exact]))
    module_path = edits_mod.kernel_module_path(args.file, args.out_dir)
    rel = os.path.relpath(args.file)
    diff = "".join(difflib.unified_diff(source.splitlines(True), new_source.splitlines(True), rel, rel))
    console.print(Syntax(diff, "diff", theme="ansi_dark"))
    console.print(f"kernel module: {os.path.relpath(module_path)} ({len([c for _, c in report.clusters() if c.kernel])} kernels)")
    if not args.yes:
        answer = input("apply these edits? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            console.print("nothing written")
            return 1
    with open(args.file, encoding="utf-8") as fh:
        if fh.read() != source:
            console.print(f"[bold red]refused[/]: {rel} changed on disk since it was analysed; run apply again")
            return 1
    with open(module_path, "w", encoding="utf-8") as fh:
        fh.write(kernel_module_text(report))
    tmp = args.file + ".fuselens-tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(new_source)
    os.replace(tmp, args.file)
    console.print(f"applied {', '.join(c.id for c in exact)} to {rel}")
    return 0
