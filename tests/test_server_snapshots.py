"""Each request is answered from the state the server held as it arrived, its snapshot: an edit or new
settings the server reads just after the request, before it has answered, never give the answer a mix
of two versions of the document, of two analyses or of two settings.

The messages a test races are sent in one write (`Client.send_together`): the server reads them in
one chunk and handles each before it answers any, as it does with messages that piled up while it was
busy (a long publication, a burst of typing).
"""

from __future__ import annotations

import dataclasses

import pytest
import pytest_asyncio
from lsprotocol import types as lsp
from pygls.workspace import TextDocument
from pytest_lsp import client_capabilities

from fuselens.contracts.report import Report
from fuselens.server.configuration import Configuration
from fuselens.server.scheduler import Analysis
from fuselens.server.settings import Settings, merge
from fuselens.server.state import Folders, OpenDocuments, ServerState

from lsp_helpers import PROFILES, Client, apply_text_edits, example_text, make_workspace, replace_line, running_server

on_the_module_loop = pytest.mark.asyncio(loop_scope="module")

EDITED = replace_line(example_text(), 19, "        x = x - 1.0")  # the first cluster's relu made a sub
# Settings that change the kernels' code (the inputs they were made for) but not the clusters.
SMALL_HALF = {"compareInductor": False, "models": {"ExampleNet": {"inputs": [[64, 1024]], "dtype": "float16"}}}
AS_STARTED = {"compareInductor": False}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=PROFILES, ids=PROFILES)
async def client(request, tmp_path_factory):
    """A server whose client sends its settings in `workspace/didChangeConfiguration` (Emacs' Eglot
    does), so that the server reads new settings as it handles that notification."""
    capabilities = client_capabilities(request.param)
    capabilities.workspace.configuration = False
    root = make_workspace(str(tmp_path_factory.mktemp("ws") / "snapshots"))
    async with running_server(request.param, root, capabilities=capabilities) as client:
        yield client


async def opened(client: Client, name: str) -> str:
    uri = client.open(name, example_text())
    await client.diagnostics_of(uri, 1)
    return uri


@on_the_module_loop
async def test_a_kernel_view_asked_for_just_before_an_edit_is_that_of_the_version_it_was_asked_about(client):
    uri = await opened(client, "snapshot_view.py")
    asked = client.request(lsp.WORKSPACE_EXECUTE_COMMAND, lsp.ExecuteCommandParams("fuselens.showKernel", [uri, "c0"]))
    (view,) = client.send_together(
        asked, client.notification(lsp.TEXT_DOCUMENT_DID_CHANGE, client.changed(uri, EDITED))
    )
    text = (await view)["text"]
    assert "line 19: x = F.relu(x)" in text and "x - 1.0" not in text  # the kernel of mul → relu → add, as shown


@on_the_module_loop
async def test_a_fix_resolved_just_before_an_edit_is_the_edit_of_the_version_it_was_offered_for(client):
    uri = await opened(client, "snapshot_fix.py")
    offered = await client.code_actions(uri, 18, resolve=False)
    fix = next(a for a in offered if a.title.startswith("Fuse lines 18–20"))
    asked = client.request(lsp.CODE_ACTION_RESOLVE, fix)
    (answer,) = client.send_together(
        asked, client.notification(lsp.TEXT_DOCUMENT_DID_CHANGE, client.changed(uri, EDITED))
    )
    if client.supports_document_changes():
        # An edit of version 1, which the client applies only to version 1 of the document.
        (step,) = (await answer).edit.document_changes
        assert step.text_document.version == 1
        fused = apply_text_edits(example_text(), step.edits)
        assert "cluster0.fits(x)" in fused and "x = F.relu(x)" in fused  # its lines, guarded by the kernel's fit
    else:
        # An edit without a version would be applied to the text the buffer holds now: it is refused.
        with pytest.raises(Exception, match="the document changed since version 1"):
            await answer


@on_the_module_loop
async def test_a_kernel_view_asked_for_just_before_new_settings_is_that_of_the_analysis_it_was_asked_about(client):
    """Its code is made with the settings its analysis was made with, not those read after it arrived:
    else the view would show kernels for inputs the hover, the lenses and the fix do not speak of."""
    uri = await opened(client, "snapshot_settings.py")
    published = len(client.published)
    asked = client.request(lsp.WORKSPACE_EXECUTE_COMMAND, lsp.ExecuteCommandParams("fuselens.showKernel", [uri, "c0"]))
    settings = client.notification(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION, {"settings": {"fuselens": SMALL_HALF}})
    try:
        (view,) = client.send_together(asked, settings)
        assert "Inputs at analysis time: x [16384, 1024] float32." in (await view)["text"]
        # The new settings do change the kernels: once the document is analyzed with them, its view says so.
        await client.diagnostics_until(uri, lambda diags: True, "the analysis with the new settings", after=published)
        view = await client.command("fuselens.showKernel", uri, "c0")
        assert "Inputs at analysis time: x [64, 1024] float16." in view["text"]
    finally:
        client.close(uri)
        client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams({"fuselens": AS_STARTED}))


def test_a_snapshot_keeps_what_it_took_whatever_the_server_keeps_after():
    """The contract itself: what a snapshot holds is frozen, and what the server does after (a new
    analysis, a comparison joined, new settings) makes new objects instead of changing those."""
    text = example_text()
    documents = {"file:///m.py": TextDocument("file:///m.py", text, version=3)}
    configuration = Configuration(warn=lambda _: None)
    state = ServerState(
        OpenDocuments(lambda: documents), configuration, Folders(lambda *_: None), lambda uri, analysis: analysis
    )
    first = Analysis(3, text, Report("/m.py", "sha"), configuration.current)
    state.analyses.keep("file:///m.py", first)
    snapshot = state.snapshot("file:///m.py")

    compared = dataclasses.replace(first, inductor_sources={"k0": "src"})
    assert state.analyses.replace("file:///m.py", first, compared)
    configuration.current, _ = merge(configuration.current, {"device": "a100"}, "settings")
    documents["file:///m.py"] = TextDocument("file:///m.py", EDITED, version=4)

    assert (snapshot.version, snapshot.text, snapshot.analysis) == (3, text, first)
    assert snapshot.settings == Settings() and snapshot.analysis.inductor_sources is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.settings.device = "a100"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.version = 4  # type: ignore[misc]
    assert state.snapshot("file:///m.py").analysis is None  # the document moved on: nothing to answer from yet
