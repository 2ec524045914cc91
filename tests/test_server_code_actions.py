"""Language server, code actions: the quick fixes that put generated kernels into the code."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pytest_lsp import client_capabilities

from fuselens.contracts import commands as command_ids
from fuselens.contracts.validation import (
    BackwardCheck,
    ClusterCheck,
    ModelValidation,
    TrainingTiming,
    ValidationReport,
)
from fuselens.server import history

from lsp_helpers import Client, example_text, make_workspace, running_server, server_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()

IMPORT_AFTER = 8  # `import torch.nn.functional as F`


def fused(name: str, first: int, last: int, call: str, fits: str = "x") -> str:
    """Lines `first`..`last` of example_net.py as a fix writes them: the kernel `name`'s `call` where it
    fits the call's arguments (`fits`), the lines as they were everywhere else."""
    original = example_text().split("\n")[first - 1 : last]
    return "\n".join(
        [
            f"        if {name}.fits({fits}):",
            f"            {call}",
            "        else:",
            *("    " + line for line in original),
        ]
    )


# ExampleNet's second cluster starts with proj1: its call passes the projection's weight and bias.
PROJ1 = "x, self.proj1.weight, self.proj1.bias"


def expected_model(stem: str, replaced: dict[tuple[int, int], str]) -> str:
    """example_net.py with each (first, last) line range replaced by a fix, and the kernels imported."""
    lines = example_text().split("\n")
    for (first, last), text in sorted(replaced.items(), reverse=True):
        lines[first - 1 : last] = text.split("\n")
    names = ", ".join(sorted({n for text in replaced.values() for n in re.findall(r"\bcluster\d+\b", text)}))
    lines[IMPORT_AFTER:IMPORT_AFTER] = [  # relative first, then absolute: a package's module or a script
        "try:  # the fused kernels beside this file, imported as a package's module or by a script",
        f"    from .{stem}_kernels import {names}",
        "except ImportError:",
        f"    from {stem}_kernels import {names}",
    ]
    return "\n".join(lines)


def model_edit(action: lsp.CodeAction, uri: str) -> lsp.TextDocumentEdit:
    edits = [
        c
        for c in action.edit.document_changes or []
        if isinstance(c, lsp.TextDocumentEdit) and c.text_document.uri == uri
    ]
    assert len(edits) == 1, action.edit
    return edits[0]


def check_how_the_module_is_written(client: Client, action: lsp.CodeAction, uri: str, module: str, ids: list[str]):
    """The edit changes the model's document only (in `changes` too, for a client without
    documentChanges); the command that runs after it writes the kernel module on disk."""
    assert list(action.edit.document_changes) == [model_edit(action, uri)], "no CreateFile, no edit of the module"
    assert action.command is not None and action.command.command == "fuselens.writeKernelModule"
    assert list(action.command.arguments) == [uri, client.versions[uri], ids]
    if not client.supports_document_changes():
        assert list(action.edit.changes) == [uri], "plain `changes` for a client without documentChanges"
        assert action.edit.changes[uri] == model_edit(action, uri).edits


async def fuse(client: Client, uri: str, action: lsp.CodeAction) -> None:
    """Do what the editor does with the chosen action: apply its edit, run its command, save."""
    client.apply_workspace_edit(action.edit)
    if action.command is not None:
        result = await client.command(action.command.command, *action.command.arguments)
        assert os.path.isfile(result["path"])
    client.save(uri)


async def test_fuse_one_cluster(client: Client):
    uri = client.open("fuse_one.py", example_text())
    await client.diagnostics_of(uri, 1)
    module = client.path("fuse_one_kernels.py")

    actions = await client.code_actions(uri, 18)
    assert [a.title for a in actions] == [
        "Fuse lines 18–20 into Triton kernel cluster0",
        "Fuse all 3 applicable clusters in ExampleNet",
    ]
    action = actions[0]
    assert action.kind == lsp.CodeActionKind.QuickFix and action.is_preferred
    assert model_edit(action, uri).text_document.version == 1  # applies only to the text it was computed from
    check_how_the_module_is_written(client, action, uri, module, ["c0"])
    assert not os.path.exists(module)  # offering a fix writes nothing

    await fuse(client, uri, action)

    with open(client.path("fuse_one.py"), encoding="utf-8") as fh:
        assert fh.read() == expected_model("fuse_one", {(18, 20): fused("cluster0", 18, 20, "x = cluster0(x)")})
    with open(module, encoding="utf-8") as fh:
        kernels = fh.read()
    compile(kernels, module, "exec")
    assert kernels.startswith('"""Triton kernels generated by fuselens for fuse_one.py.')
    assert "@triton.jit\ndef _cluster0_kernel" in kernels and "\ndef cluster0(x):" in kernels

    # The saved file is analyzed again: the two other clusters are still there, seven lines down (the
    # fix is three lines longer than the three it replaced, the import four lines long).
    diags = await client.diagnostics_of(uri)
    clusters = sorted(
        (d.range.start.line + 1, d.range.end.line + 1, d.message.split(",")[0])
        for d in diags
        if d.message.startswith("fusable:")
    )
    assert clusters == [(29, 32, "fusable: linear → gelu → sigmoid → mul"), (35, 37, "fusable: tanh → mul → softmax")]
    assert [a.title for a in await client.code_actions(uri, 30)] == [
        "Fuse lines 29–32 into Triton kernel cluster1",
        "Fuse all 2 applicable clusters in ExampleNet",
        "Restore the original code of every fused cluster in fuse_one.py",  # cluster0 is applied
    ]


async def test_a_fix_for_a_cluster_measured_slower_in_training_says_it_trains_through_the_original_code(
    client: Client,
):
    """The file's last validation (kept in its history, as `fuselens validate` and the editor keep it)
    measured cluster0's kernels at 0.80× torch.compile in a training step: its fix says so, and the
    module it writes runs the original lines when gradients are wanted (no backward is registered)."""
    path = client.path("slow_training.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(example_text())
    timing = TrainingTiming(compiled_step_us=80.0, fused_step_us=100.0, step_vs_compiled=0.8)
    check = ClusterCheck(
        "c0", "cluster0", "verified", "mul → relu → add", backward=BackwardCheck("verified", ["x"], timing=timing)
    )
    models = [ModelValidation("ExampleNet", [[16384, 1024]], ["float32"], [check])]
    history.record(path, ValidationReport(path, "cuda", "NVIDIA H100 80GB HBM3", models), print)
    uri = client.open("slow_training.py")
    await client.diagnostics_of(uri, 1)

    actions = await client.code_actions(uri, 18)
    assert [a.title for a in actions] == [
        "Fuse lines 18–20 into Triton kernel cluster0 (trains through the original code: 0.80× torch.compile in training)",
        "Fuse all 3 applicable clusters in ExampleNet",
    ]
    await fuse(client, uri, actions[0])
    with open(client.path("slow_training_kernels.py"), encoding="utf-8") as fh:
        kernels = fh.read()
    assert "_register_backward('cluster0'" not in kernels and "\ndef cluster0(x):" in kernels
    assert "# Training: cluster0 trains through the original code: its kernels' training step" in kernels


async def test_fuse_all_clusters(client: Client):
    uri = client.open("fuse_all.py", example_text())
    await client.diagnostics_of(uri, 1)
    module = client.path("fuse_all_kernels.py")

    actions = await client.code_actions(uri, 24)
    assert [a.title for a in actions] == [
        "Fuse lines 22–25 into Triton kernel cluster1",
        "Fuse all 3 applicable clusters in ExampleNet",
    ]
    action = actions[1]
    assert action.kind == lsp.CodeActionKind.RefactorRewrite and not action.is_preferred
    assert model_edit(action, uri).text_document.version == 1
    check_how_the_module_is_written(client, action, uri, module, ["c0", "c1", "c2"])

    await fuse(client, uri, action)

    assert client.texts[uri] == expected_model(
        "fuse_all",
        {
            (18, 20): fused("cluster0", 18, 20, "x = cluster0(x)"),
            (22, 25): fused("cluster1", 22, 25, f"x = cluster1({PROJ1})", f"{PROJ1}, module=self"),
            (28, 30): fused("cluster2", 28, 30, "return cluster2(x)"),
        },
    )
    with open(module, encoding="utf-8") as fh:
        kernels = fh.read()
    compile(kernels, module, "exec")
    for name, params in (("cluster0", "x"), ("cluster1", "x, weight, bias"), ("cluster2", "x")):
        assert f"@triton.jit\ndef _{name}_" in kernels and f"\ndef {name}({params}):" in kernels
    diags = await client.diagnostics_of(uri)
    assert [d for d in diags if d.message.startswith("fusable:")] == []


async def test_fuse_a_gemm_and_the_ops_after_it(client: Client, tmp_path):
    """A cluster that starts with a GEMM is offered and fused as any other: the fix calls it with the
    GEMM's operands where the lines called the projection, and the module it writes (the one `fuselens
    apply` writes) holds the fused GEMM kernel, the epilogue's own kernel and the choice between them."""
    with open(os.path.join(os.path.dirname(__file__), "..", "examples", "pyproject.toml"), encoding="utf-8") as fh:
        client.write("pyproject.toml", fh.read())  # the examples' inputs
    uri = client.open("gemms.py", example_text("gemm_epilogues.py"))
    await client.diagnostics_of(uri, 1)
    actions = await client.code_actions(uri, 27)
    assert [a.title for a in actions] == ["Fuse line 27 into Triton kernel cluster0"]
    check_how_the_module_is_written(client, actions[0], uri, client.path("gemms_kernels.py"), ["c0"])
    await fuse(client, uri, actions[0])
    call = "cluster0(x, self.fc1.weight, self.fc1.bias)"
    fits = "cluster0.fits(x, self.fc1.weight, self.fc1.bias, module=self)"
    assert f"        return self.fc2({call} if {fits} else F.gelu(self.fc1(x)))\n" in client.texts[uri]
    with open(client.path("gemms_kernels.py"), encoding="utf-8") as fh:
        kernels = fh.read()
    compile(kernels, "gemms_kernels.py", "exec")
    for part in (
        "def _cluster0_kernel_gemm(",
        "def cluster0_epilogue(",
        "def _cluster0_library(",
        "def _gemm_fastest(",
    ):
        assert part in kernels, part

    elsewhere = tmp_path / "gemms.py"
    elsewhere.write_text(example_text("gemm_epilogues.py"))
    shutil.copy(client.path("pyproject.toml"), tmp_path / "pyproject.toml")
    cli = [sys.executable, "-m", "fuselens.cli.main", "apply", str(elsewhere), "--cluster", "c0", "--yes", "--no-check"]
    applied = subprocess.run(cli, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert (tmp_path / "gemms_kernels.py").read_text(encoding="utf-8") == kernels


async def test_a_second_fix_merges_into_the_module_on_disk(client: Client):
    """Fusing a second cluster later merges into the module the first fix wrote, on disk: an editor
    that leaves a file it edits unsaved (Neovim, Emacs) would otherwise keep the second kernel in a
    buffer nobody saves, and the fix would do nothing."""
    uri = client.open("fuse_twice.py", example_text())
    await client.diagnostics_of(uri, 1)
    await fuse(client, uri, (await client.code_actions(uri, 18))[0])
    await client.diagnostics_of(uri)

    action = (await client.code_actions(uri, 31))[0]
    assert action.title == "Fuse lines 29–32 into Triton kernel cluster1"
    check_how_the_module_is_written(client, action, uri, client.path("fuse_twice_kernels.py"), ["c1"])
    await fuse(client, uri, action)
    with open(client.path("fuse_twice_kernels.py"), encoding="utf-8") as fh:
        kernels = fh.read()
    assert "\ndef cluster0(x):" in kernels and "\ndef cluster1(x, weight, bias):" in kernels
    assert client.unsaved == {}, "no buffer left for the user to save"
    assert "    from .fuse_twice_kernels import cluster0, cluster1\n" in client.texts[uri]
    assert "    from fuse_twice_kernels import cluster0, cluster1\n" in client.texts[uri]
    diags = await client.diagnostics_of(uri)
    assert [d.message.split(",")[0] for d in diags if d.message.startswith("fusable:")] == [
        "fusable: tanh → mul → softmax"
    ]


def generated(client: Client, name: str) -> list[str]:
    """The server's log lines that say it generated the kernels' code of `name`."""
    return [m.message for m in client.log_messages if m.message.startswith(f"generated the kernels of {name} ")]


async def test_a_fix_is_offered_in_a_few_hundred_bytes_and_resolved_once_its_code_is_generated(
    client: Client, tmp_path
):
    """A save's analysis leaves the kernels' code out, and so does offering a fix: its title, the command
    and the ids its edit is resolved from when the user picks it.  Resolving generates the code the
    command then writes, once for the version whatever asks for it (a kernel view after it here); the
    module is byte for byte the one `fuselens apply` writes."""
    uri = client.open("fuse_as_apply.py", example_text())
    await client.diagnostics_of(uri, 1)
    offered = await client.code_actions(uri, 18, resolve=False)
    assert [a.title for a in offered] == [
        "Fuse lines 18–20 into Triton kernel cluster0",
        "Fuse all 3 applicable clusters in ExampleNet",
    ]
    for action in offered:
        size = len(json.dumps(client.protocol._converter.unstructure(action)))
        assert action.edit is None and size < 1024, (size, action)
    await client.roundtrip()
    assert generated(client, "fuse_as_apply.py") == []

    action = await client.resolved(offered[0])
    assert model_edit(action, uri).text_document.version == 1
    check_how_the_module_is_written(client, action, uri, client.path("fuse_as_apply_kernels.py"), ["c0"])
    assert "@triton.jit" in (await client.command(command_ids.SHOW_KERNEL, uri, "c0"))["text"]
    await fuse(client, uri, action)
    assert client.texts[uri] == expected_model(
        "fuse_as_apply", {(18, 20): fused("cluster0", 18, 20, "x = cluster0(x)")}
    )
    assert [m.split(" in ")[0] for m in generated(client, "fuse_as_apply.py")] == [
        "generated the kernels of fuse_as_apply.py v1"
    ]

    elsewhere = tmp_path / "fuse_as_apply.py"
    elsewhere.write_text(example_text())
    applied = subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", "apply", str(elsewhere), "--cluster", "c0", "--yes", "--no-check"],
        capture_output=True,
        text=True,
    )
    assert applied.returncode == 0, applied.stderr
    with (
        open(client.path("fuse_as_apply_kernels.py"), encoding="utf-8") as fix,
        open(tmp_path / "fuse_as_apply_kernels.py", encoding="utf-8") as apply,
    ):
        assert fix.read() == apply.read()


async def test_a_client_that_does_not_resolve_gets_the_edit_at_once_and_the_command_generates_the_code(tmp_path):
    """Emacs' Eglot (1.9) resolves no code action: its fixes come whole, and the command that follows the
    edit generates the kernels' code before it writes the module."""
    capabilities = client_capabilities("neovim")
    capabilities.text_document.code_action.resolve_support = None
    root = make_workspace(str(tmp_path / "ws"))
    async with running_server("neovim", root, capabilities=capabilities) as eager:
        uri = eager.open("fuse_eager.py", example_text())
        await eager.diagnostics_of(uri, 1)
        action = (await eager.code_actions(uri, 18, resolve=False))[0]
        assert action.data is None
        check_how_the_module_is_written(eager, action, uri, eager.path("fuse_eager_kernels.py"), ["c0"])
        await eager.roundtrip()
        assert generated(eager, "fuse_eager.py") == []
        await fuse(eager, uri, action)
        assert eager.texts[uri] == expected_model(
            "fuse_eager", {(18, 20): fused("cluster0", 18, 20, "x = cluster0(x)")}
        )
        with open(eager.path("fuse_eager_kernels.py"), encoding="utf-8") as fh:
            assert "\ndef cluster0(x):" in fh.read()
        assert len(generated(eager, "fuse_eager.py")) == 1


def chains(diags: list[lsp.Diagnostic]) -> list[str]:
    return [d.message.split(",")[0].removeprefix("fusable: ") for d in diags if d.message.startswith("fusable:")]


async def test_two_fixes_in_a_row_without_saving(client: Client):
    """Once a fix has written its kernels, the edited buffer is analyzed with them: the next fix is
    offered before the user saves anything, and both fixes' kernels are on disk."""
    uri = client.open("fuse_unsaved.py", example_text())
    await client.diagnostics_of(uri, 1)
    first = (await client.code_actions(uri, 18))[0]
    client.apply_workspace_edit(first.edit)
    await client.command(first.command.command, *first.command.arguments)
    assert chains(await client.diagnostics_of(uri)) == ["linear → gelu → sigmoid → mul", "tanh → mul → softmax"]

    second = (await client.code_actions(uri, 31))[0]
    assert second.title == "Fuse lines 29–32 into Triton kernel cluster1"
    client.apply_workspace_edit(second.edit)
    await client.command(second.command.command, *second.command.arguments)
    with open(client.path("fuse_unsaved_kernels.py"), encoding="utf-8") as fh:
        kernels = fh.read()
    assert "\ndef cluster0(x):" in kernels and "\ndef cluster1(x, weight, bias):" in kernels
    assert client.unsaved == {}, "no buffer left for the user to save"
    assert chains(await client.diagnostics_of(uri)) == ["tanh → mul → softmax"]
    with open(client.path("fuse_unsaved.py"), encoding="utf-8") as fh:
        assert fh.read() == example_text()  # the model's own lines are the user's to save


async def test_no_actions_outside_clusters_or_after_typing(client: Client):
    uri = client.open("fuse_none.py", example_text())
    await client.diagnostics_of(uri, 1)
    assert await client.code_actions(uri, 14) == []  # __init__
    assert await client.code_actions(uri, 27) == []  # the Linear before the softmax's cluster
    client.change(uri, example_text().replace("x = x * 2.0", "x = x * 4.0"))
    assert await client.code_actions(uri, 18) == []  # the edit would be for a text that is gone


async def test_write_module_refuses_a_stale_version(client: Client):
    uri = client.open("fuse_stale.py", example_text())
    await client.diagnostics_of(uri, 1)
    with pytest.raises(JsonRpcException, match="changed since version 7"):
        await client.command("fuselens.writeKernelModule", uri, 7, ["c0"])
    with pytest.raises(JsonRpcException, match="no kernels for clusters"):
        await client.command("fuselens.writeKernelModule", uri, 1, ["c9"])
    assert not os.path.exists(client.path("fuse_stale_kernels.py"))


LLAMA = """from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
model = LlamaForCausalLM(config)  # fuselens: input=(2, 16)
"""


async def test_fuse_a_cluster_in_library_code(client: Client):
    pytest.importorskip("transformers")
    uri = client.open("patch_llama.py", LLAMA)
    diags = await client.diagnostics_of(uri, 1, timeout=180)
    assert any(d.range.start.line == 4 and "modeling_llama.py" in d.message for d in diags), diags
    actions = await client.code_actions(uri, 5)  # the model's line reaches transformers' code
    titles = [a.title for a in actions]
    norm = "LlamaRMSNorm.forward (library code)"
    assert any(norm in t for t in titles) and titles[-1].startswith("Fuse all "), titles
    action = next(a for a in actions if norm in a.title)
    name = action.title.split("Triton kernel ")[1].split(",")[0]
    await fuse(client, uri, action)

    with open(client.path("patch_llama.py"), encoding="utf-8") as fh:
        text = fh.read()
    # The file gains the import of install() and its call, nothing else: the library's code is patched
    assert text == LLAMA.replace(
        "\nconfig",
        "try:  # the fused kernels beside this file, imported as a package's module or by a script\n"
        "    from .patch_llama_kernels import install\n"
        "except ImportError:\n"
        "    from patch_llama_kernels import install\n"
        "install()  # fused kernels inside the library's code (the kernel module's uninstall() undoes it)\n"
        "\nconfig",
        1,
    )
    with open(client.path("patch_llama_kernels.py"), encoding="utf-8") as fh:
        module = fh.read()
    compile(module, "patch_llama_kernels.py", "exec")
    assert f"# ---- library patch: transformers.models.llama.modeling_llama.LlamaRMSNorm.forward: {name}\n" in module
    assert f"_fuselens_patch_llama_kernels.{name}(" in module and "\ndef install():" in module
    # Only the chosen cluster is patched
    assert module.count("# ---- library patch: ") == 1


async def test_two_library_patches_in_a_row_both_on_disk(client: Client):
    """The second patch of a library's code changes the kernel module only (the file already calls
    install()): the module on disk gets it, with nothing left for the user to save, and the cluster
    goes from the diagnostics."""
    pytest.importorskip("transformers")
    uri = client.open("patch_twice.py", LLAMA)
    await client.diagnostics_of(uri, 1, timeout=180)
    norm = next(a for a in await client.code_actions(uri, 5) if "LlamaRMSNorm.forward (library code)" in a.title)
    await fuse(client, uri, norm)
    diags = await client.diagnostics_of(uri, timeout=180)
    model_line = 1 + client.texts[uri].split("\n").index(LLAMA.split("\n")[4])
    assert any("patch of LlamaMLP.forward (" in d.message for d in diags), diags

    mlp = next(a for a in await client.code_actions(uri, model_line) if "LlamaMLP.forward (library code)" in a.title)
    assert list(model_edit(mlp, uri).edits) == []  # install() is called already: the buffer is not touched
    await fuse(client, uri, mlp)
    with open(client.path("patch_twice_kernels.py"), encoding="utf-8") as fh:
        module = fh.read()
    assert "modeling_llama.LlamaRMSNorm.forward: " in module and "modeling_llama.LlamaMLP.forward: " in module
    assert module.count("# ---- library patch: ") == 2
    assert client.unsaved == {}, "no buffer left for the user to save"
    diags = await client.diagnostics_until(
        uri, lambda d: not any("patch of LlamaMLP.forward (" in x.message for x in d), "no MLP cluster", timeout=180
    )
    assert diags and not any("patch of LlamaRMSNorm.forward (" in d.message for d in diags), diags


async def test_restore_the_original_code(client: Client):
    uri = client.open("restore_me.py", example_text())
    await client.diagnostics_of(uri, 1)
    await fuse(client, uri, (await client.code_actions(uri, 18))[0])
    await client.diagnostics_of(uri)
    assert client.texts[uri] == expected_model("restore_me", {(18, 20): fused("cluster0", 18, 20, "x = cluster0(x)")})
    call = 18 + 4  # the import above it is four lines long
    titles = [a.title for a in await client.code_actions(uri, call)]
    assert titles[:2] == [
        "Restore the original code of cluster0",
        "Restore the original code of every fused cluster in restore_me.py",
    ]
    # Away from the call, only the file-wide restore
    assert [a.title for a in await client.code_actions(uri, 2) if a.title.startswith("Restore")] == [titles[1]]
    restore = (await client.code_actions(uri, call))[0]
    assert restore.kind == lsp.CodeActionKind.RefactorRewrite
    client.apply_workspace_edit(restore.edit)
    assert client.texts[uri] == example_text()  # the lines, and no import of the kernel module left
    client.save(uri)
    await client.diagnostics_of(uri)
    assert not any(a.title.startswith("Restore") for a in await client.code_actions(uri, 18))


async def test_a_kernel_module_the_user_wrote_disables_the_fix(client: Client):
    client.write("handmade_kernels.py", "def mine():\n    pass\n")
    uri = client.open("handmade.py", example_text())
    await client.diagnostics_of(uri, 1)
    actions = await client.code_actions(uri, 18)
    assert len(actions) == 1 and actions[0].edit is None
    assert actions[0].disabled is not None and "was not written by fuselens" in actions[0].disabled.reason
    with open(client.path("handmade_kernels.py"), encoding="utf-8") as fh:
        assert fh.read() == "def mine():\n    pass\n"
