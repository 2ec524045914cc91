"""Source rewrites: a pattern's lines replaced by a call that computes the same (`Rewrite` in the report).

Where a cluster gets a generated kernel, a pattern of some kinds gets a rewrite of the user's own code
into a call torch already has (hand-written attention into `F.scaled_dot_product_attention`).  Every
function here is a pure function of the source text and the report, so that `fuselens apply`, the
quick fix and restore make the same edits:

- `rewrite_edits` turns the rewrites a user picked into line edits: each rewrite's lines, and the
  imports they need that the file lacks (`edits.fix_edits` adds the clusters' edits, but for those a
  chosen rewrite replaces: their ops are the rewrite's, or their lines are);
- a rewrite is written only over the lines it was made from (`Stale` otherwise: never over text the
  user typed since);
- what restoring needs is kept in the kernel module, beside the kernels' records (`record_section`):
  the lines written, the lines they replaced and the imports added for them, read back from the
  module's syntax tree (`kept_rewrites`), never run.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass

from fuselens.contracts.report import Report, Rewrite

from .line_edits import LineEdit, after_imports

_REWRITE_ID = re.compile(r"r\d+")


class Stale(Exception):
    """The file no longer holds the lines a rewrite was made from: nothing of it is written."""


def is_rewrite_id(name: str) -> bool:
    """Whether a fix id names a rewrite (`r0`) rather than a cluster (`c0`)."""
    return bool(_REWRITE_ID.fullmatch(name))


def chosen_rewrites(report: Report, ids: list[str] | None) -> list[Rewrite]:
    """The rewrites `ids` names (every one when None), in the report's order."""
    return [r for _, _, r in report.rewrites() if ids is None or r.id in ids]


def replaced_clusters(report: Report, rewrites: list[Rewrite]) -> dict[str, str]:
    """cluster id -> the id of the chosen rewrite that replaces it (computes its ops, or rewrites its lines)."""
    replaced: dict[str, str] = {}
    for rewrite in rewrites:
        for cluster_id in rewrite.replaces:
            replaced.setdefault(cluster_id, rewrite.id)
    return replaced


def rewrite_edits(source: str, rewrites: list[Rewrite]) -> list[LineEdit]:
    """Each rewrite's lines, and one edit that adds the imports they need that `source` lacks."""
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    edits = []
    taken: list[tuple[int, int, str]] = []
    for rewrite in rewrites:
        check_fresh(lines, rewrite)
        for first, last, other in taken:
            if rewrite.start_line <= last and rewrite.end_line >= first:
                raise Stale(f"the rewrites {other} and {rewrite.id} change the same lines: apply one of them")
        taken.append((rewrite.start_line, rewrite.end_line, rewrite.id))
        edits.append(LineEdit(rewrite.start_line, rewrite.end_line, rewrite.text))
    wanted = missing_imports(source, [i for r in rewrites for i in r.imports])
    if wanted:
        at = after_imports(source)
        edits.append(LineEdit(at, at - 1, "".join(f"{statement}\n" for statement in wanted)))
    return edits


def check_fresh(lines: list[str], rewrite: Rewrite) -> None:
    """Stale unless lines `start_line..end_line` are the rewrite's `original`, as it was made from them."""
    span = _span(rewrite.start_line, rewrite.end_line)
    if rewrite.start_line < 1 or rewrite.end_line > len(lines) or rewrite.end_line < rewrite.start_line:
        raise Stale(f"{span} are no longer in the file: the rewrite {rewrite.id} was made for another text")
    here = "".join(lines[rewrite.start_line - 1 : rewrite.end_line])
    if here != rewrite.original:
        raise Stale(
            f"{span} changed since they were analyzed: the rewrite {rewrite.id} is not written over them "
            "(save the file to analyze it again)"
        )


def _span(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}–{last}"


def missing_imports(source: str, imports: list[str]) -> list[str]:
    """The import statements of `imports` (each once) that the top of `source` does not already make,
    in whichever form (`import torch.nn.functional as F` is there in `from torch.nn import functional as F`
    too)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = ast.Module(body=[], type_ignores=[])
    have = {binding for node in tree.body for binding in _bindings(node)}
    missing = []
    for statement in dict.fromkeys(imports):
        wanted = {b for node in ast.parse(statement).body for b in _bindings(node)}
        if not wanted <= have:
            missing.append(statement)
    return missing


def _bindings(node: ast.stmt) -> set[tuple[str, str]]:
    """(local name, what it is bound to) for each name a top-level import statement binds."""
    if isinstance(node, ast.Import):
        out = set()
        for alias in node.names:
            if alias.asname:
                out.add((alias.asname, alias.name))
            else:
                out.add((alias.name.split(".")[0], alias.name.split(".")[0]))
        return out
    if isinstance(node, ast.ImportFrom) and node.module:  # (relative: the kernel module's, beside the file)
        module = "." * node.level + node.module
        return {(alias.asname or alias.name, f"{module}.{alias.name}") for alias in node.names}
    if isinstance(node, ast.Try):  # (`try: import ... except ImportError: ...` at the top)
        return {b for inner in node.body for b in _bindings(inner)}
    return set()


# ---- what restoring needs, kept in the kernel module ---------------------------------------------

MARKER = "# ---- source rewrite: "
MARKER_RE = re.compile(r"^# ---- source rewrite: (\w+)", re.M)
_RECORD_RE = re.compile(r"_rewritten_(\w+)")


@dataclass(frozen=True)
class Record:
    """A rewrite as applied: what restoring it needs."""

    name: str  # "rewrite_<digest of its lines>": the same rewrite applied twice is one record
    written: str  # the lines apply wrote
    original: str  # the lines they replaced
    imports: tuple[str, ...]  # the import statements apply added for it
    label: str  # what it rewrote, for a title: "attention (rewritten as F.scaled_dot_product_attention)"


def records(source: str, report: Report, ids: list[str] | None) -> list[Record]:
    """The records of the rewrites `ids` (all when None) applied to `source`."""
    out = []
    for _, pattern, rewrite in report.rewrites():
        if ids is not None and rewrite.id not in ids:
            continue
        added = tuple(missing_imports(source, rewrite.imports))
        label = f"{pattern.name} (rewritten as {rewrite.call.split('(')[0]})" if rewrite.call else pattern.name
        out.append(Record(record_name(rewrite), rewrite.text, rewrite.original, added, label))
    return out


def record_name(rewrite: Rewrite) -> str:
    digest = hashlib.sha256(f"{rewrite.text}\0{rewrite.original}".encode()).hexdigest()[:12]
    return f"rewrite_{digest}"


def record_section(record: Record) -> str:
    """The kernel module's section that keeps `record`."""
    value = (record.written, record.original, list(record.imports), record.label)
    return (
        f"{MARKER}{record.name}: {record.label}\n\n"
        f"# The lines `fuselens apply` wrote for {record.label}, the lines they replaced and the imports it\n"
        "# added (restoring puts the lines back, and takes out an import nothing else uses).\n"
        f"_rewritten_{record.name} = {value!r}\n"
    )


def existing_records(module_text: str) -> dict[str, str]:
    """record name -> its section, of a module written with rewrite records."""
    out = {}
    for match in MARKER_RE.finditer(module_text):
        start = match.start()
        end = module_text.find("\n# ---- ", start + 1)
        out[match.group(1)] = module_text[start : end if end != -1 else len(module_text)].rstrip() + "\n"
    return out


def named_assignments(module_text: str, name: re.Pattern[str]) -> list[tuple[re.Match[str], ast.expr]]:
    """The module-level assignments `<name> = <value>` of a kernel module whose one target's name matches
    `name` in full, with the match and the value's syntax: read from its syntax tree, never run (none
    where the text does not parse)."""
    try:
        tree = ast.parse(module_text)
    except SyntaxError:
        return []
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            match = name.fullmatch(node.targets[0].id)
            if match is not None:
                found.append((match, node.value))
    return found


def kept_rewrites(module_text: str) -> dict[str, Record]:
    """The records a kernel module keeps, read from its syntax tree (never run)."""
    kept = {}
    for match, value in named_assignments(module_text, _RECORD_RE):
        try:
            written, original, imports, label = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError):
            continue
        if all(isinstance(t, str) for t in (written, original, label)) and all(isinstance(i, str) for i in imports):
            kept[match.group(1)] = Record(match.group(1), written, original, tuple(imports), label)
    return kept


@dataclass
class Restored:
    """A text with rewrites put back: which records were, and why the others were not."""

    text: str
    restored: list[str]
    refused: list[str]
    labels: dict[str, str]


def restore_rewrites(text: str, kept: dict[str, Record], names: list[str] | None) -> Restored:
    """`text` with the lines of the rewrites `names` (every one `text` holds, when None) put back as they
    were, and the imports applying them added taken out again where nothing else uses their names.  A
    rewrite whose lines are not in `text` exactly once, as apply wrote them, is left as it is (and, when
    asked for by name, refused, saying why)."""
    lines = text.splitlines(keepends=True)
    result = Restored(text, [], [], {})
    added: list[str] = []
    for name in kept if names is None else names:
        record = kept.get(name)
        if record is None:
            result.refused.append(f"{name}: the kernel module keeps no rewrite of that name")
            continue
        block = record.written.splitlines(keepends=True)
        places = [i for i in range(len(lines) - len(block) + 1) if block and lines[i : i + len(block)] == block]
        if len(places) != 1:
            if names is not None:
                why = "no longer as apply wrote them" if not places else "written in more than one place"
                result.refused.append(f"{name}: the lines apply wrote for {record.label} are {why}")
            continue
        at = places[0]
        lines[at : at + len(block)] = record.original.splitlines(keepends=True)
        result.restored.append(name)
        result.labels[name] = record.label
        added += [i for i in record.imports if i not in added]
    still = [i for name, r in kept.items() if name not in result.restored for i in r.imports]
    result.text = _without_unused_imports("".join(lines), [i for i in added if i not in still])
    return result


def _without_unused_imports(text: str, statements: list[str]) -> str:
    """`text` without each top-level statement of `statements` (as written) whose names it no longer uses."""
    if not statements:
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    lines = text.splitlines(keepends=True)
    drop = []
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.end_lineno != node.lineno:
            continue
        if lines[node.lineno - 1].strip() in statements and not {name for name, _ in _bindings(node)} & used:
            drop.append(node.lineno - 1)
    for index in reversed(drop):
        del lines[index]
    return "".join(lines)
