"""Source rewrites, the mechanism: a pattern's lines replaced by a call torch has, written only over the
lines they were made from, with the imports they need, and put back by restore.

These drive the text functions `fuselens apply`, the quick fix and restore share, with a report that
holds one rewrite; the attention tests (`test_attention.py`) drive them through the CLI and the server."""

from __future__ import annotations

import pytest

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import rewrites as rewrites_mod
from fuselens.codegen.module import module_for_report
from fuselens.contracts import report as R

SOURCE = """\
import math

import torch


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        probs = scores.softmax(-1)
        return probs @ v
"""
ORIGINAL = """\
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        probs = scores.softmax(-1)
        return probs @ v
"""
WRITTEN = "        return F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(q.size(-1)))\n"
IMPORT = "import torch.nn.functional as F"


def report_with(rewrite: R.Rewrite, clusters: list[R.Cluster] | None = None) -> R.Report:
    pattern = R.Pattern("attention", [], "model.py", [8, 10], R.PatternEstimate(1000, 100, 10.0), rewrite=rewrite)
    model = R.Model("Attention", "model.py", 6, "analyzed", clusters=clusters or [], patterns=[pattern])
    return R.Report("model.py", "", models=[model])


def attention_rewrite(**changes) -> R.Rewrite:
    fields = dict(
        id="r0",
        file="model.py",
        start_line=8,
        end_line=10,
        original=ORIGINAL,
        text=WRITTEN,
        imports=[IMPORT],
        title="Rewrite lines 8–10 as F.scaled_dot_product_attention",
        call="F.scaled_dot_product_attention(q, k, v, scale=...)",
        replaces=["c0"],
    )
    fields.update(changes)
    return R.Rewrite(**fields)


def softmax_cluster() -> R.Cluster:
    """The softmax on line 9, with the edit and kernel `apply` would write: the rewrite replaces it."""
    return R.Cluster(
        id="c0",
        kind="reduction",
        ops=[],
        inputs=[],
        outputs=[],
        file="model.py",
        lines=[9, 9],
        function="Attention.forward",
        mapping="exact",
        mapping_detail="",
        bytes_unfused=10,
        bytes_fused=5,
        regime="dram-bound",
        kernel=R.Kernel("cluster0", "model_kernels.py", "def cluster0(x): ..."),
        edit=R.Edit(
            9, 9, "        probs = cluster0(scores)\n", "from model_kernels import cluster0", "cluster0(scores)"
        ),
        applies="edit",
    )


def test_a_rewrite_replaces_its_lines_and_adds_the_import_it_needs_once():
    report = report_with(attention_rewrite())
    edits = edits_mod.fix_edits(SOURCE, report)
    written = edits_mod.apply_line_edits(SOURCE, edits)
    assert written == SOURCE.replace(ORIGINAL, WRITTEN).replace("import torch\n", f"import torch\n{IMPORT}\n")
    # The softmax cluster is the rewrite's: its call is not written beside it.
    assert "cluster0" not in written
    # A file that imports the module in another form gets no second import.
    other_form = SOURCE.replace("import math\n\n", "import math\nfrom torch.nn import functional as F\n")
    assert IMPORT not in edits_mod.apply_line_edits(other_form, edits_mod.fix_edits(other_form, report))


def test_a_cluster_the_rewrite_replaces_still_applies_alone():
    report = report_with(attention_rewrite(), [softmax_cluster()])
    written = edits_mod.apply_line_edits(SOURCE, edits_mod.fix_edits(SOURCE, report, ["c0"]))
    assert "probs = cluster0(scores)" in written and "scaled_dot_product_attention" not in written
    both = edits_mod.apply_line_edits(SOURCE, edits_mod.fix_edits(SOURCE, report, ["c0", "r0"]))
    assert "cluster0" not in both and WRITTEN in both


@pytest.mark.parametrize(
    "typed",
    [
        lambda s: s.replace("probs = scores.softmax(-1)", "probs = scores.softmax(-1) * 2"),  # a line changed
        lambda s: s.replace("        probs = scores.softmax(-1)\n", ""),  # a line gone: every line moves
        lambda s: "# a comment\n" + s,  # lines above typed in: the lines moved down
    ],
)
def test_a_rewrite_made_for_other_text_is_refused_and_nothing_is_written_over_it(typed):
    report = report_with(attention_rewrite())
    with pytest.raises(rewrites_mod.Stale, match=r"lines 8–10 .*the rewrite r0"):
        edits_mod.fix_edits(typed(SOURCE), report)


def test_restore_puts_the_lines_back_and_takes_out_the_import_only_the_rewrite_used(tmp_path):
    rewrite = attention_rewrite()
    report = report_with(rewrite)
    applied = edits_mod.apply_line_edits(SOURCE, edits_mod.fix_edits(SOURCE, report))
    records = rewrites_mod.records(SOURCE, report, ["r0"])
    assert [r.imports for r in records] == [(IMPORT,)]
    module = module_for_report(report, None, [], records)
    compile(module, "model_kernels.py", "exec")
    # Merged into again by a later apply (of nothing more), the record stays.
    module = module_for_report(report, module, [])
    assert list(rewrites_mod.kept_rewrites(module)) == [records[0].name]

    plan = edits_mod.restore_edits(applied, "model.py", "model_kernels.py", module)
    assert plan.restored == [records[0].name] and not plan.refused
    assert plan.labels[records[0].name] == "attention (rewritten as F.scaled_dot_product_attention)"
    assert edits_mod.apply_line_edits(applied, plan.edits) == SOURCE

    # Code the user wrote since that uses `F` keeps its import.
    used = applied.replace("class Attention", "ACT = F.gelu\n\n\nclass Attention")
    assert used != applied
    plan = edits_mod.restore_edits(used, "model.py", "model_kernels.py", module)
    assert IMPORT in edits_mod.apply_line_edits(used, plan.edits)


def test_restore_refuses_a_rewrite_whose_lines_the_user_changed():
    report = report_with(attention_rewrite())
    applied = edits_mod.apply_line_edits(SOURCE, edits_mod.fix_edits(SOURCE, report))
    module = module_for_report(report, None, [], rewrites_mod.records(SOURCE, report, None))
    name = next(iter(rewrites_mod.kept_rewrites(module)))
    changed = applied.replace("scale=1 / math.sqrt", "scale=0.5 / math.sqrt")
    plan = edits_mod.restore_edits(changed, "model.py", "model_kernels.py", module, [name])
    assert plan.edits == [] and plan.restored == []
    assert plan.refused == [
        f"{name}: the lines apply wrote for attention (rewritten as "
        "F.scaled_dot_product_attention) are no longer as apply wrote them"
    ]
    # Restoring everything leaves it too, and says nothing of it: there is nothing of it to restore.
    assert edits_mod.restore_edits(changed, "model.py", "model_kernels.py", module).edits == []
