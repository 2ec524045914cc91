"""`fuselens apply`: validate the kernels, show the diff, ask, then write the kernel module and the edits."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from rich.markup import escape

from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.pipeline.apply import NOT_CONFIRMED, ApplyResult, apply_file
from fuselens.server import history

from .output import console_for_output, print_diff


def run_apply(args: argparse.Namespace, analyze_options: AnalyzeOptions) -> int:
    console = console_for_output()
    declined = [NOT_CONFIRMED]  # why the edits were not confirmed, as the refusal says it

    def confirm(result: ApplyResult) -> bool:
        print_diff(console, result.diff)
        console.print(f"kernel module: {escape(os.path.relpath(result.module_path))}")
        if args.yes:
            return True
        if not sys.stdin.isatty():  # nobody to answer: a script must say --yes
            declined[0] = "no terminal to confirm on (pass --yes to apply without asking)"
            return False
        try:
            return input("apply these edits? [y/N] ").strip().lower() in ("y", "yes")
        except EOFError:
            return False

    def progress(message: str, fraction=None) -> None:
        console.print(f"[dim]… {escape(message)}[/]")

    # The file's validations' training measurements: a cluster measured slower trains through its
    # original code (`contracts/training.py`).
    analyze_options = dataclasses.replace(analyze_options, training=history.measured(args.file, _warn))
    check = None if args.no_check else ValidateOptions(interpret=args.interpret or not _has_cuda())
    if check is not None and check.interpret:  # before the model's file can import Triton
        os.environ["TRITON_INTERPRET"] = "1"
    result = apply_file(args.file, analyze_options, args.cluster, confirm, check, progress)
    for line in result.skipped:
        console.print(f"[yellow]skip[/] {escape(line)}")
    if result.refused == NOT_CONFIRMED:
        console.print(f"not applied: {escape(declined[0])}")
        return 1
    if result.refused:
        console.print(f"[bold red]refused[/]: {escape(result.refused)}")
        return 1
    if not result.applied and result.skipped:
        console.print("nothing applied: no cluster could be applied (each skip above says why)")
        return 1
    if not result.applied:
        console.print(f"nothing to apply: {escape(os.path.relpath(args.file))} has no fusable cluster or rewrite")
        return 0
    console.print(
        f"applied {', '.join(result.applied)} to {escape(os.path.relpath(args.file))}; "
        f"kernels in {escape(os.path.relpath(result.module_path))}"
    )
    for line in result.original_in_training:
        console.print(f"[yellow]training[/] {escape(line)}")
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _warn(line: str) -> None:
    print(f"fuselens: {line}", file=sys.stderr)
