"""Robustness, trust and isolation (docs/SECURITY.md): generated files are written only inside the
workspace, whatever the report or the file says; nothing read from a file is evaluated; and the
worker runs the model under a memory limit.

(tests/test_server_trust.py covers who may trust a workspace, test_server_process.py the
scrubbed environment and processes.)
"""

from __future__ import annotations

import ast
import json
import os

import pytest
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException

from fuselens.server import views

from lsp_helpers import Client, example_text, path_of, replace_line, server_fixture, uri_of
from robust_helpers import errors, fusable, worker_host

pytestmark = pytest.mark.asyncio(loop_scope="module")

MEMORY_MB = 2048


def outside_folder(root: str) -> str:
    """A folder beside the workspace, not in it."""
    return root + " outside"


def user_config(root: str) -> str:
    """The user's own config folder (XDG_CONFIG_HOME), outside the workspace."""
    return root + " config"


def prepare(root: str) -> None:
    """A model in a folder outside the workspace, which the user trusts too (in their trust file)."""
    os.makedirs(outside_folder(root))
    with open(os.path.join(outside_folder(root), "stray_model.py"), "w", encoding="utf-8") as fh:
        fh.write(example_text())
    os.makedirs(os.path.join(user_config(root), "fuselens"))
    with open(os.path.join(user_config(root), "fuselens", "trusted-folders.json"), "w", encoding="utf-8") as fh:
        json.dump([outside_folder(root)], fh)


client = server_fixture(
    init_options={"workspaceTrusted": True, "settings": {"worker": {"memoryMb": MEMORY_MB}}},
    prepare=prepare,
    server_env=lambda root: {"XDG_CONFIG_HOME": user_config(root)},
)


def files_outside(root: str) -> set[str]:
    """Every file under the workspace's parent folder that is not in the workspace."""
    parent, found = os.path.dirname(root), set()
    for folder, _, names in os.walk(parent):
        if folder == root or folder.startswith(root + os.sep):
            continue
        found |= {os.path.join(folder, n) for n in names}
    return found


def inside(path: str, root: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


def uris_in(action: lsp.CodeAction) -> list[str]:
    """Every URI an action would touch: its document changes, plain changes and command arguments."""
    uris = [
        c.uri if isinstance(c, (lsp.CreateFile, lsp.RenameFile, lsp.DeleteFile)) else c.text_document.uri
        for c in action.edit.document_changes or []
    ]
    uris += list(action.edit.changes or {})
    if action.command:
        uris += [a for a in action.command.arguments or [] if isinstance(a, str) and ":" in a]
    return uris


async def test_generated_files_stay_inside_the_workspace(client: Client):
    """Kernel modules go beside the model, in the workspace; views (what "Show kernel" opens) go to the
    user's cache folder, nowhere else."""
    before = files_outside(client.root)
    uri = client.open("iso_model.py", example_text())
    await client.diagnostics_of(uri, 1)

    shown = await client.command("fuselens.showKernel", uri)
    assert shown["path"] == os.path.join(views.views_folder(client.root, "kernels"), "iso_model_kernels.py")
    actions = await client.code_actions(uri, 18)
    assert actions
    for action in actions:
        for touched in uris_in(action):
            assert inside(path_of(touched), client.root), touched
    client.apply_workspace_edit(actions[0].edit)
    if actions[0].command:  # a client that cannot create files: the command writes the module
        written = await client.command(actions[0].command.command, *actions[0].command.arguments)
        assert written["path"] == client.path("iso_model_kernels.py")
    assert os.path.isfile(client.path("iso_model_kernels.py"))
    assert files_outside(client.root) == before


async def test_a_model_outside_the_workspace_gets_no_files_beside_it(client: Client):
    """A file opened from outside the workspace folder, in a folder the user trusts too: analyzed, its
    views go to the workspace's views folder, and no quick fix would write beside it."""
    before = files_outside(client.root)
    stray = os.path.join(outside_folder(client.root), "stray_model.py")
    uri = uri_of(stray)
    client.texts[uri], client.versions[uri] = example_text(), 1
    client.text_document_did_open(
        lsp.DidOpenTextDocumentParams(
            lsp.TextDocumentItem(uri=uri, language_id="python", version=1, text=example_text())
        )
    )
    assert len(fusable(await client.diagnostics_of(uri, 1))) == 3

    shown = await client.command("fuselens.showKernel", uri)
    assert inside(shown["path"], views.views_folder(client.root, "kernels"))
    assert await client.code_actions(uri, 18) == []
    with pytest.raises(JsonRpcException, match="outside the workspace; nothing written"):
        await client.command("fuselens.writeKernelModule", uri, 1, ["c0"])
    assert files_outside(client.root) == before  # no stray_model_kernels.py out there
    client.close(uri)


async def test_a_report_cannot_choose_where_files_go(client: Client, tmp_path):
    """The report comes from the worker, which ran the model's code: here that code rewrites where
    the report says the kernel module goes.  The server writes (and offers to write) only beside
    the model, in the workspace."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    evil = str(elsewhere / "evil_kernels.py")
    text = replace_line(example_text(), 9, "import fuselens.codegen.edits as _edits")
    text = replace_line(text, 10, f"_edits.kernel_module_path = lambda model, out_dir=None: {evil!r}")
    uri = client.open("iso_report.py", text)
    diags = await client.diagnostics_of(uri, 1)
    assert len(fusable(diags)) == 3

    assert await client.code_actions(uri, 18) == []
    with pytest.raises(JsonRpcException, match="must sit beside the model file"):
        await client.command("fuselens.writeKernelModule", uri, 1, ["c0"])
    shown = await client.command("fuselens.showKernel", uri, "c0")
    assert shown["path"] == os.path.join(views.views_folder(client.root, "kernels"), "iso_report_cluster0.py")
    assert os.listdir(elsewhere) == []


async def test_nothing_in_a_comment_is_evaluated(client: Client, tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    cases = {
        "iso_eval_input.py": (f"# fuselens: input=({payload},)", "must be integers like 16384,1024"),
        "iso_eval_init.py": (
            f"# fuselens: input=(8, 1024) init=(width={payload})",
            "init value for 'width' must be a literal",
        ),
        "iso_eval_dtype.py": (f"# fuselens: input=(8, 1024) {payload}", "unknown dtype '__import__'"),
    }
    for name, (comment, words) in cases.items():
        text = replace_line(example_text(), 11, f"class ExampleNet(nn.Module):  {comment}")
        uri = client.open(name, text)
        diags = await client.diagnostics_of(uri, 1)
        (problem,) = [d for d in diags if d.code == "inputs"]
        assert problem.range.start.line + 1 == 11, problem
        assert problem.severity == lsp.DiagnosticSeverity.Warning
        assert "the inline comment on line 11" in problem.message and words in problem.message, problem.message
        assert fusable(diags) == [] and errors(diags) == []
    assert not marker.exists()


async def test_the_worker_runs_under_a_memory_limit(client: Client, figures):
    """A model reading its own RLIMIT_AS at import (and writing it beside itself, in the workspace)
    sees a finite limit: what the warm host maps plus worker.memoryMb."""
    import resource

    out = os.path.join(client.root, "rlimit_as.txt")
    text = replace_line(
        example_text(), 9, f"import resource; open({out!r}, 'w').write(repr(resource.getrlimit(resource.RLIMIT_AS)))"
    )
    with open(f"/proc/{worker_host(client)}/statm") as fh:
        host_mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    uri = client.open("iso_rlimit.py", text)
    assert len(fusable(await client.diagnostics_of(uri, 1))) == 3
    with open(out) as fh:
        soft, hard = ast.literal_eval(fh.read())
    figures[f"worker_rlimit_as_mb_{client.profile}"] = soft // 2**20
    assert soft == hard != resource.RLIM_INFINITY
    assert MEMORY_MB * 2**20 < soft < host_mapped + (MEMORY_MB + 512) * 2**20
