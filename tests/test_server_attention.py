"""Language server, hand-written attention: its diagnostic and hover (the bytes, the kernel the fused call
runs on the profiled device), the quick fix that rewrites it to `F.scaled_dot_product_attention` (the
same text `fuselens apply` writes) and the action that puts it back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException

from fuselens.contracts import commands as command_ids

from lsp_helpers import EXAMPLES, Client, server_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()

# example -> (the attention's first and last line, the rewrite's title)
ATTENTION = {
    "llama_block.py": (62, 64, "Rewrite lines 62–64 as F.scaled_dot_product_attention (the scores stay on chip)"),
    "nanogpt_attention.py": (
        65,
        69,
        "Rewrite lines 65–69 as F.scaled_dot_product_attention (the scores stay on chip)",
    ),
    "encoder_attention.py": (
        36,
        40,
        "Rewrite lines 36–40 as F.scaled_dot_product_attention (the scores stay on chip)",
    ),
}


def example(name: str) -> str:
    with open(os.path.join(EXAMPLES, name), encoding="utf-8") as fh:
        return fh.read()


def applied_by_the_cli(tmp_path, name: str, *which: str) -> str:
    """The example after `fuselens apply` (of the ids `which`: all when none), in a folder of its own."""
    folder = tmp_path / name.removesuffix(".py")
    folder.mkdir()
    for file in (name, "pyproject.toml"):
        (folder / file).write_text(example(file), encoding="utf-8")
    chosen = [arg for i in which for arg in ("--cluster", i)]
    done = subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", "apply", str(folder / name), *chosen, "--yes", "--no-check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return (folder / name).read_text(encoding="utf-8")


def attention_diagnostic(diags: list[lsp.Diagnostic]) -> lsp.Diagnostic:
    (found,) = [d for d in diags if d.code == "pattern:attention"]
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ATTENTION))
async def test_the_quick_fix_rewrites_the_attention_as_apply_does_and_restores_it(client: Client, tmp_path, name):
    first, last, title = ATTENTION[name]
    uri = client.open(name)
    diags = await client.diagnostics_of(uri, 1, timeout=180)
    found = attention_diagnostic(diags)
    assert (found.range.start.line + 1, found.range.end.line + 1) == (first, last)
    assert found.severity == lsp.DiagnosticSeverity.Information  # as a cluster is shown
    assert found.message.startswith("fusable: attention, ") and "the quick fix rewrites it as F.scaled" in found.message

    offered = await client.code_actions(uri, first + 1, resolve=False)
    (action,) = [a for a in offered if a.title == title]
    assert action.kind == lsp.CodeActionKind.QuickFix and action.edit is None  # resolved when picked
    action = await client.resolved(action)
    (change,) = action.edit.document_changes
    assert change.text_document.uri == uri and change.text_document.version == 1
    assert action.command.command == command_ids.WRITE_KERNEL_MODULE
    assert list(action.command.arguments) == [uri, 1, ["r0"]]

    client.apply_workspace_edit(action.edit)
    written = await client.command(action.command.command, *action.command.arguments)
    assert written["path"] == client.path(name.replace(".py", "_kernels.py"))
    client.save(uri)
    assert client.texts[uri] == applied_by_the_cli(tmp_path, name, "r0")  # what `fuselens apply` writes, to the byte
    with open(written["path"], encoding="utf-8") as fh:
        assert "# ---- source rewrite: rewrite_" in fh.read()

    after = await client.diagnostics_of(uri, timeout=180)
    assert not [d for d in after if d.code == "pattern:attention"]  # rewritten: nothing left to fuse there
    restores = [a for a in await client.code_actions(uri, first) if a.title.startswith("Restore")]
    assert restores[0].title == "Restore the original code of attention (rewritten as F.scaled_dot_product_attention)"
    client.apply_workspace_edit(restores[0].edit)
    assert client.texts[uri] == example(name)
    client.save(uri)
    await client.diagnostics_of(uri, timeout=180)
    client.close(uri)


@pytest.mark.slow
async def test_the_hover_on_the_attention_says_its_bytes_and_the_kernel_that_would_run_it(client: Client):
    uri = client.open("hover_attention.py", example("llama_block.py"))
    await client.diagnostics_of(uri, 1, timeout=180)
    text = (await client.hover(uri, 63)).contents.value
    details = text.split("\n---\n")[0]
    assert details.startswith("**⚡ attention · `r0` · LlamaBlock**")
    assert "**3.6 GB → 64 MB** (−98%) DRAM traffic, **dram-bound**" in details
    assert "the 4×8×2048×2048 float32 scores" in details
    assert "**on NVIDIA H200**: FlashAttention: bfloat16, head dim 128, no mask" in details
    assert "F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(self.head_dim))" in details
    assert "in place of cluster c3" in details
    # The cluster of the line follows it.
    assert "**⚡ c3 · reduction · `cluster3` · LlamaBlock**" in text
    client.close(uri)


@pytest.mark.slow
async def test_a_rewrite_offered_for_an_older_text_is_never_resolved_over_a_newer_one(client: Client):
    uri = client.open("stale_attention.py", example("llama_block.py"))
    await client.diagnostics_of(uri, 1, timeout=180)
    offered = await client.code_actions(uri, 62, resolve=False)
    (rewrite,) = [a for a in offered if a.title.startswith("Rewrite lines 62–64")]
    client.change(uri, client.texts[uri].replace("scores = torch.matmul", "scores = 2 * torch.matmul"))
    with pytest.raises(JsonRpcException, match="the document changed since version 1"):
        await client.resolved(rewrite)
    assert "scores = 2 * torch.matmul" in client.texts[uri]
    client.close(uri)


@pytest.mark.slow
async def test_fusing_all_of_a_model_rewrites_its_attention_in_place_of_the_softmax_cluster(client: Client, tmp_path):
    uri = client.open("fuse_all_attention.py", example("llama_block.py"))
    await client.diagnostics_of(uri, 1, timeout=180)
    (everything,) = [a for a in await client.code_actions(uri, 62) if a.title.startswith("Fuse all")]
    # The softmax's cluster (c3) is the attention's: the six others (c5 and c6 start at their GEMMs), and the rewrite.
    assert everything.title == "Fuse all 6 applicable clusters and apply 1 rewrite in LlamaBlock"
    assert list(everything.command.arguments)[2] == ["c0", "c1", "c2", "c4", "c5", "c6", "r0"]
    client.apply_workspace_edit(everything.edit)
    await client.command(everything.command.command, *everything.command.arguments)
    client.save(uri)
    cli = applied_by_the_cli(tmp_path, "llama_block.py").replace("llama_block_kernels", "fuse_all_attention_kernels")
    assert client.texts[uri] == cli
    client.close(uri)
