"""A benchmark's figures on disk: `<stem>.json` (what was measured, with its provenance) and
`<stem>.md` (the table), written again after every size, so that a cut run keeps what it measured."""

from __future__ import annotations

import json
import os


def write_results(out: str, stem: str, measured: dict, table: str) -> None:
    with open(os.path.join(out, f"{stem}.json"), "w", encoding="utf-8") as fh:
        json.dump(measured, fh, indent=1)
    with open(os.path.join(out, f"{stem}.md"), "w", encoding="utf-8") as fh:
        fh.write(table)
