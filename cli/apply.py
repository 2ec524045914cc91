"""`fuselens apply`: show the diff, ask, then write the kernel module and the edits."""

from __future__ import annotations

import argparse
import os

from rich.console import Console
from rich.syntax import Syntax

from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline.apply import ApplyResult, apply_file


def run_apply(args: argparse.Namespace, analyze_options: AnalyzeOptions) -> int:
    console = Console()

    def confirm(result: ApplyResult) -> bool:
        console.print(Syntax(result.diff, "diff", theme="ansi_dark"))
        console.print(f"kernel module: {os.path.relpath(result.module_path)}")
        if args.yes:
            return True
        return input("apply these edits? [y/N] ").strip().lower() in ("y", "yes")

    result = apply_file(args.file, analyze_options, args.cluster, confirm)
    for line in result.skipped:
        console.print(f"[yellow]skip[/] {line}")
    if result.refused:
        console.print(f"[bold red]refused[/]: {result.refused}")
        return 1
    if not result.applied:
        console.print("nothing to apply: no cluster maps exactly onto its lines")
        return 0
    console.print(
        f"applied {', '.join(result.applied)} to {os.path.relpath(args.file)}; "
        f"kernels in {os.path.relpath(result.module_path)}"
    )
    return 0
