"""`fuselens profile --save-corpus`: the sizes a profile saw, as the corpus of each model's declared sizes.

Where the nearest pyproject.toml declares the model's sizes (`[tool.fuselens.models.<Class>]` `dims`),
each size's `corpus` there is set to what was seen, through a TOML editor that keeps the rest of the
file as it was, comments and layout included (tomlkit); the file is replaced whole, never left half
written.  Sizes declared elsewhere (the class-line comment, the command line, the editor's settings)
get the table printed, to paste: fuselens never rewrites a model's source."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape

from fuselens.contracts.config import find_pyproject
from fuselens.contracts.dynamic import Size
from fuselens.contracts.report import Report


def corpora(sizes: list[Size], seen: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each size's corpus: the values seen within its range (a size not seen keeps its corpus)."""
    return {
        size.name: [v for v in seen.get(size.name, []) if size.min <= v <= size.max] or size.corpus for size in sizes
    }


def corpus_table(name: str, sizes: list[Size], seen: dict[str, list[int]]) -> str:
    """The model's `[tool.fuselens.models.<name>]` dims, each size's corpus what `corpora` says."""
    corpus = corpora(sizes, seen)
    entries = [
        f"{size.name} = {{ min = {size.min}, max = {size.max}, corpus = [{', '.join(map(str, corpus[size.name]))}] }}"
        for size in sizes
    ]
    return f"[tool.fuselens.models.{name}]\ndims = {{ {', '.join(entries)} }}\n"


def write_corpus(pyproject: str, name: str, corpus: dict[str, list[int]]) -> bool:
    """Set the corpus of each size the model's table in `pyproject` declares; False (the file untouched)
    where the table declares none of them, or the TOML editor is not installed."""
    try:
        import tomlkit  # (a dependency; a bare install without it prints the table instead)
    except ImportError:
        return False
    with open(pyproject, encoding="utf-8") as source:
        document = tomlkit.parse(source.read())
    dims = _table(_table(_table(_table(_table(document, "tool"), "fuselens"), "models"), name), "dims")
    declared = [size for size in corpus if _table(dims, size)]
    if dims is None or not declared:
        return False
    for size in declared:
        dims[size]["corpus"] = corpus[size]
    folder = os.path.dirname(os.path.abspath(pyproject))
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, prefix=".pyproject-", delete=False) as out:
        out.write(tomlkit.dumps(document))
    os.replace(out.name, pyproject)
    return True


def outside_ranges(sizes: list[Size], seen: dict[str, list[int]]) -> list[str]:
    """ "seq = 4096 is past 1..2048" for each value seen outside its size's declared range."""
    return [
        f"{size.name} = {v} is outside {size.min}..{size.max}"
        for size in sizes
        for v in seen.get(size.name, [])
        if not size.min <= v <= size.max
    ]


def _table(container: Any, key: str) -> Any:
    """`container[key]` where both are tables (TOML's, or inline ones), else None."""
    value = container.get(key) if isinstance(container, Mapping) else None
    return value if isinstance(value, Mapping) else None


def print_corpora(report: Report, console: Console) -> int:
    """Save (or, where the sizes are not declared in pyproject.toml, print) each profiled model's corpus;
    the number of models that had one."""
    profiled = {m.name: m for m in report.profile.models} if report.profile else {}
    pyproject = find_pyproject(report.file)
    printed = 0
    for model in report.models:
        found = profiled.get(model.name)
        if model.dynamic is None or found is None or not found.sizes_seen:
            continue
        sizes, seen = model.dynamic.sizes, found.sizes_seen
        if pyproject is not None and write_corpus(pyproject, model.name, corpora(sizes, seen)):
            console.print(f"corpus seen for {escape(model.name)} saved in {escape(pyproject)}:", highlight=False)
        else:
            console.print(
                f"corpus seen for {escape(model.name)}; its sizes are not declared in a pyproject.toml "
                "(fuselens does not rewrite the model's source): put these dims in one:",
                highlight=False,
            )
        console.print(escape(corpus_table(model.name, sizes, seen)), highlight=False)
        for line in outside_ranges(sizes, seen):
            console.print(f"  [yellow]{escape(line)}[/]: left out of the corpus", highlight=False)
        if found.cpu_budget_bytes is not None:
            console.print(
                "  [yellow]seen at the smaller inputs a CPU profiles at[/] (--full-size: at the analyzed ones)",
                highlight=False,
            )
        printed += 1
    if not printed:
        console.print("no model with declared dynamic sizes was profiled: no corpus to save", highlight=False)
    return printed
