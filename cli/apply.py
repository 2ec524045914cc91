"""`fuselens apply`: validate the kernels, show the diff, ask, then write the kernel module and the edits."""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax

from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.pipeline.apply import ApplyResult, apply_file


def run_apply(args: argparse.Namespace, analyze_options: AnalyzeOptions) -> int:
    console = Console()

    def confirm(result: ApplyResult) -> bool:
        console.print(Syntax(result.diff, "diff", theme="ansi_dark"))
        console.print(f"kernel module: {os.path.relpath(result.module_path)}")
        if args.yes:
            return True
        if not sys.stdin.isatty():  # nobody to answer: a script must say --yes
            console.print("not applied: no terminal to confirm on (pass --yes to apply without asking)")
            return False
        try:
            return input("apply these edits? [y/N] ").strip().lower() in ("y", "yes")
        except EOFError:
            return False

    def progress(message: str, fraction=None) -> None:
        console.print(f"[dim]… {escape(message)}[/]")

    check = None if args.no_check else ValidateOptions(interpret=args.interpret or not _has_cuda())
    if check is not None and check.interpret:  # before the model's file can import Triton
        os.environ["TRITON_INTERPRET"] = "1"
    result = apply_file(args.file, analyze_options, args.cluster, confirm, check, progress)
    for line in result.skipped:
        console.print(f"[yellow]skip[/] {line}")
    if result.refused:
        console.print(f"[bold red]refused[/]: {result.refused}")
        return 1
    if not result.applied:
        console.print("nothing to apply: no cluster can be applied (each skip above says why)")
        return 0
    console.print(
        f"applied {', '.join(result.applied)} to {os.path.relpath(args.file)}; "
        f"kernels in {os.path.relpath(result.module_path)}"
    )
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
