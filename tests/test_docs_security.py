"""docs/SECURITY.md names, for each promise, the test that keeps it: every test it names exists, and
every section of promises names at least one."""

from __future__ import annotations

import ast
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECURITY = os.path.join(REPO, "docs", "SECURITY.md")
NAMED = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def _read() -> str:
    with open(SECURITY, encoding="utf-8") as fh:
        return fh.read()


def _functions(path: str) -> set[str]:
    with open(os.path.join(REPO, path), encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_test_the_security_page_names_exists():
    named = NAMED.findall(_read())
    assert len(named) >= 30, "the page names too few tests to keep its promises"
    missing = []
    for path, function in named:
        if not os.path.isfile(os.path.join(REPO, path)):
            missing.append(path)
        elif function and function not in _functions(path):
            missing.append(f"{path}::{function}")
    assert missing == []


def test_every_section_of_promises_names_its_tests():
    sections = re.split(r"^## ", _read(), flags=re.M)[1:]
    without = [s.splitlines()[0] for s in sections if not NAMED.search(s)]
    assert without == []
