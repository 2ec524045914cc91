"""`fuselens restore`: put back the code `fuselens apply` replaced, from what the kernel module keeps.

The file gets back its bytes: its encoding, byte-order mark and line endings stay, and the lines
restored are the ones apply replaced."""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console
from rich.markup import escape

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.codegen.source_file import SourceError, edited_bytes, read_source
from fuselens.pipeline.apply import unified_diff, write_edited

from .output import console_for_output, print_diff


def run_restore(args: argparse.Namespace) -> int:
    console = console_for_output()
    path = args.file
    module_path = edits_mod.kernel_module_path(path, args.out_dir)
    try:
        module_text = files.check_kernel_module(module_path)
    except files.Refused as exc:
        return _refused(console, str(exc))
    if module_text is None:
        console.print(f"nothing to restore: there is no {os.path.basename(module_path)}")
        return 1 if args.kernel else 0
    try:
        read = read_source(path)
    except SourceError as exc:
        return _refused(console, str(exc))
    source = read.text
    plan = edits_mod.restore_edits(source, path, module_path, module_text, args.kernel)
    for line in plan.refused:
        console.print(f"[yellow]skip[/] {line}")
    if not plan.edits:
        console.print("nothing to restore")
        return 1 if plan.refused and args.kernel else 0
    new_source = edits_mod.apply_line_edits(source, plan.edits)
    try:
        new_bytes = edited_bytes(read, new_source)
    except SourceError as exc:
        return _refused(console, str(exc))
    rel = os.path.relpath(path)
    print_diff(console, unified_diff(path, source, new_source))
    if not args.yes:
        if not sys.stdin.isatty():  # nobody to answer: a script must say --yes
            console.print("not restored: no terminal to confirm on (pass --yes to restore without asking)")
            return 1
        if not _confirmed():
            console.print("not restored")
            return 1
    try:
        write_edited(read, new_bytes)
    except files.Refused as exc:
        return _refused(console, str(exc))
    restored = ", ".join(plan.labels.get(name, name) for name in plan.restored)
    console.print(f"restored {escape(restored)} in {rel} (the kernel module is left as it is)")
    return 0


def _refused(console: Console, why: str) -> int:
    console.print(f"[bold red]refused[/]: {escape(why)}", highlight=False)
    return 1


def _confirmed() -> bool:
    try:
        return input("restore? [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False
