"""The command-line templates of `remoteRunner` and `remoteProfiler`: checked, then filled in.

A template such as "ssh gpu fuselens validate {file} --json {json}" may name only `{file}` (the
model's path, required) and `{json}` (a file for the result); `{{` and `}}` are literal braces.  It
is split into words as a shell would split it and each word is filled in on its own, so that a path
is always exactly one argument whatever characters it holds.  The settings check each template when
they are read (`settings.py`), and the runner again before it runs one (`runner.py`).
"""

from __future__ import annotations

import shlex
import string

FIELDS = ("file", "json")


def template_problem(template: str, setting: str = "remoteRunner") -> str | None:
    """Why `template` cannot be run, in words for the user that name `setting`; None if it can."""
    fault = template_fault(template)
    return None if fault is None else f"{setting} {fault}"


def template_fault(template: str) -> str | None:
    """What is wrong with `template` ("is empty", "'ssh gpu' has no {file} ..."); None if nothing."""
    try:
        words = shlex.split(template)
    except ValueError as exc:  # "No closing quotation"
        return f"{template!r} cannot be split into words: {str(exc).lower()}"
    if not words:
        return "is empty"
    fields: set[str] = set()
    for word in words:
        try:
            parsed = list(string.Formatter().parse(word))
        except ValueError as exc:  # a single "{" or "}"
            return f"{template!r}: {exc} (write {{{{ or }}}} for a literal brace)"
        for _, name, spec, conversion in parsed:
            if name is None:
                continue
            if name not in FIELDS:
                return (
                    f"{template!r} has the field {{{name}}}; "
                    "only {file} and {json} are filled in (write {{ or }} for a literal brace)"
                )
            if spec or conversion:
                return f"{template!r}: {{{name}}} takes no format or conversion"
            fields.add(name)
    if "file" not in fields:
        return f"{template!r} has no {{file}} for the model's path"
    return None


def command_line(template: str, path: str, result: str) -> list[str]:
    """The command's argument vector: the template's words, each filled in (a checked template)."""
    return [word.format(file=path, json=result) for word in shlex.split(template)]
