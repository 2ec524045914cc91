"""`fuselens profile --save-corpus`: the sizes a profile saw, as the corpus of each model's declared sizes.

The corpus belongs in pyproject.toml's `[tool.fuselens.models.<Class>]` table, beside whatever else the
file says; rewriting it without losing the file's comments and layout takes a TOML editor that keeps
them, which is not installed with fuselens, so the table is printed to paste in its place."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from fuselens.contracts.dynamic import Size
from fuselens.contracts.report import Report


def corpus_table(name: str, sizes: list[Size], seen: dict[str, list[int]]) -> str:
    """The model's `[tool.fuselens.models.<name>]` dims, each size's corpus the values seen within its range
    (a size not seen keeps its corpus)."""
    entries = []
    for size in sizes:
        values = [v for v in seen.get(size.name, []) if size.min <= v <= size.max] or size.corpus
        corpus = ", ".join(map(str, values))
        entries.append(f"{size.name} = {{ min = {size.min}, max = {size.max}, corpus = [{corpus}] }}")
    return f"[tool.fuselens.models.{name}]\ndims = {{ {', '.join(entries)} }}\n"


def outside_ranges(sizes: list[Size], seen: dict[str, list[int]]) -> list[str]:
    """ "seq = 4096 is past 1..2048" for each value seen outside its size's declared range."""
    return [
        f"{size.name} = {v} is outside {size.min}..{size.max}"
        for size in sizes
        for v in seen.get(size.name, [])
        if not size.min <= v <= size.max
    ]


def print_corpora(report: Report, console: Console) -> int:
    """Print each profiled model's corpus table; the number of models that had one."""
    profiled = {m.name: m for m in report.profile.models} if report.profile else {}
    printed = 0
    for model in report.models:
        found = profiled.get(model.name)
        if model.dynamic is None or found is None or not found.sizes_seen:
            continue
        console.print(f"corpus seen for {escape(model.name)}; in pyproject.toml:", highlight=False)
        console.print(escape(corpus_table(model.name, model.dynamic.sizes, found.sizes_seen)), highlight=False)
        for line in outside_ranges(model.dynamic.sizes, found.sizes_seen):
            console.print(f"  [yellow]{escape(line)}[/]: left out of the corpus", highlight=False)
        if found.cpu_budget_bytes is not None:
            console.print(
                "  [yellow]seen at the smaller inputs a CPU profiles at[/] (--full-size: at the analyzed ones)",
                highlight=False,
            )
        printed += 1
    if printed:
        console.print(
            "pyproject.toml was not changed: no TOML editor that keeps the file's comments is installed; "
            "put the dims above in place of the model's own",
            highlight=False,
        )
    else:
        console.print("no model with declared dynamic sizes was profiled: no corpus to save", highlight=False)
    return printed
