"""`fuselens restore`: put back the code `fuselens apply` replaced, from what the kernel module keeps."""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from rich.console import Console
from rich.syntax import Syntax

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files


def run_restore(args: argparse.Namespace) -> int:
    console = Console()
    path = args.file
    module_path = edits_mod.kernel_module_path(path, args.out_dir)
    try:
        module_text = files.check_kernel_module(module_path)
    except files.Refused as exc:
        console.print(f"[bold red]refused[/]: {exc}")
        return 1
    if module_text is None:
        console.print(f"nothing to restore: there is no {os.path.basename(module_path)}")
        return 0
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    plan = edits_mod.restore_edits(source, path, module_path, module_text, args.kernel)
    for line in plan.refused:
        console.print(f"[yellow]skip[/] {line}")
    if not plan.edits:
        console.print("nothing to restore")
        return 1 if plan.refused and args.kernel else 0
    new_source = edits_mod.apply_line_edits(source, plan.edits)
    rel = os.path.relpath(path)
    console.print(
        Syntax("".join(difflib.unified_diff(source.splitlines(True), new_source.splitlines(True), rel, rel)), "diff")
    )
    if not args.yes and not _confirmed():
        console.print("not restored")
        return 1
    with open(path, encoding="utf-8") as fh:
        if fh.read() != source:
            console.print(f"[bold red]refused[/]: {rel} changed on disk meanwhile; nothing was written")
            return 1
    try:
        files.replace_text(path, new_source)
    except files.Refused as exc:
        console.print(f"[bold red]refused[/]: {exc}")
        return 1
    console.print(f"restored {', '.join(plan.restored)} in {rel} (the kernel module is left as it is)")
    return 0


def _confirmed() -> bool:
    if not sys.stdin.isatty():  # nobody to answer: a script must say --yes
        return False
    try:
        return input("restore? [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False
