"""The README's and the docs' summaries of the GPU benchmarks say what docs/benchmarks.md's tables measured,
and the README's examples print what it shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(name: str) -> str:
    with open(os.path.join(REPO, name), encoding="utf-8") as fh:
        return fh.read()


def table_after(text: str, heading: str) -> list[dict[str, str]]:
    """The first markdown table below `heading`, as rows of {column: cell}."""
    rows: list[dict[str, str]] = []
    header = None
    for line in text.split(heading, 1)[1].splitlines():
        if not line.startswith("|"):
            if header is not None:
                break  # the table's end
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-:"):
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def ratio(cell: str) -> float:
    return float(cell.rstrip("×"))


def test_the_readme_states_the_loss_figures_of_the_table():
    rows = table_after(read("docs/benchmarks.md"), "## A language model's loss")
    assert len(rows) >= 6, rows
    compile_ratios = [ratio(r["applied vs better compile"]) for r in rows]
    eager_ratios = [ratio(r["applied vs eager"]) for r in rows]
    readme = " ".join(read("README.md").split())  # (sentences wrap)
    claimed = re.search(
        r"runs at (\d+\.\d+)–(\d+\.\d+)× the better `torch.compile` mode and (\d+\.\d+)–(\d+\.\d+)× eager", readme
    )
    assert claimed, "the README's sentence on the loss benchmark"
    low, high, eager_low, eager_high = (float(x) for x in claimed.groups())
    assert (low, high) == (min(compile_ratios), max(compile_ratios))
    assert (eager_low, eager_high) == (min(eager_ratios), max(eager_ratios))


def test_the_held_out_summary_counts_the_rows_of_its_table():
    text = read("docs/benchmarks.md")
    rows = [r for r in table_after(text, "## A held-out suite") if r["regime"] == "dram-bound"]
    ratios = [ratio(r["vs better compile"]) for r in rows]
    summary = " ".join(text.split("## A held-out suite", 1)[1].split())
    claimed = re.search(
        r"Of the (\d+) DRAM-bound clusters, (\d+) run at 1\.00× the better `torch.compile` mode or better and "
        r"(\d+) at 0\.95× or better",
        summary,
    )
    assert claimed, "the sentence that sums up the held-out table"
    total, at_par, near = (int(x) for x in claimed.groups())
    assert total == len(rows)
    assert at_par == sum(r >= 1.0 for r in ratios)
    assert near == sum(r >= 0.95 for r in ratios)
    readme = " ".join(read("README.md").split())
    stated = re.search(
        r"(\d+) of (\d+) DRAM-bound clusters run at 0\.95× or better \((\d+) at 1\.00× or better\)", readme
    )
    assert stated, "the README's sentence on the held-out suite"
    assert [int(x) for x in stated.groups()] == [near, total, at_par]


def test_the_readme_training_figures_are_the_training_table_s():
    doc = read("docs/benchmarks.md")
    # The latest training table, every case at 8192 tokens.
    latest = table_after(doc, "**The forward keeps each row's statistics")
    rows = {r["case"]: ratio(r["applied vs better compile"]) for r in latest if r["tokens"] == "8192"}
    readme = " ".join(read("README.md").split())
    sentence = readme.split("Training, one step", 1)[1].split("(`python benchmarks/training.py`)", 1)[0]
    stated = {
        "RMSNorm": r"RMSNorm (\d+\.\d+)×",
        "softmax (attention scores)": r"attention softmax (\d+\.\d+)×",
        "SwiGLU": r"SwiGLU (\d+\.\d+)×",
        "RoPE": r"RoPE (\d+\.\d+)×",
        "LayerNorm + residual": r"LayerNorm of a residual sum (\d+\.\d+)×",
        "residual + RMSNorm": r"residual add \+ RMSNorm (\d+\.\d+)×",
        "cross-entropy (vocabulary 128256)": r"`F.cross_entropy` over a 128256-word vocabulary (\d+\.\d+)×",
        "Llama block (examples/llama_block.py)": r"the whole Llama block example (\d+\.\d+)×",
    }
    for case, pattern in stated.items():
        found = re.search(pattern, sentence)
        assert found, case
        assert float(found[1]) == rows[case], case


# ---- the README's examples, run as it says --------------------------------------------------------

_INSTALLED = os.path.join(os.path.dirname(sys.executable), "fuselens")
COMMAND = [_INSTALLED] if os.path.exists(_INSTALLED) else [sys.executable, "-m", "fuselens.cli.main"]


def block_after(text: str, marker: str, fence: str = "```") -> str:
    """The first fenced block after `marker`."""
    rest = text.split(marker, 1)[1]
    start = rest.index(fence)
    body = rest[rest.index("\n", start) + 1 :]
    return body[: body.index("```")]


def test_the_readme_sample_output_is_what_its_command_prints():
    """The report under "What you get" is the quick start's command as it prints today, piped."""
    readme = read("README.md")
    command = re.search(r"fuselens analyze examples/example_net\.py --input-shape 16384,1024", readme)
    assert command, "the quick start's command"
    done = subprocess.run([*COMMAND, *command[0].split()[1:]], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = "\n".join(line.rstrip() for line in done.stdout.rstrip("\n").splitlines()) + "\n"
    assert block_after(readme, "## What you get") == printed


def test_the_readme_model_built_from_a_configuration_takes_its_inputs_as_it_says(tmp_path):
    pytest.importorskip("transformers")
    readme = read("README.md")
    code = block_after(readme, "A model built at module level", "```python")
    (tmp_path / "llama_config.py").write_text(code)
    done = subprocess.run([*COMMAND, "analyze", "llama_config.py"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first == "llama_config.py:11 model  inputs (4, 512) int64  from the inline comment on line 11", first
    assert "no dtype was given for the inputs: int64 token ids" in " ".join(done.stdout.split())
