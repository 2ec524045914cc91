"""Language server, workspace commands: analyze, validate (with progress), show kernels."""

from __future__ import annotations

import os
import re

import pytest
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException

from fuselens.server import views

from lsp_helpers import INTERPRET, Client, analyzed_fixture, example_text, server_fixture, uri_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()
analyzed = analyzed_fixture()


def outside(root: str) -> str:
    return root.rstrip(os.sep) + "-outside"


def view_linked_outside(root: str) -> None:
    """The view of cluster1 is a link to a file outside the views folder (planted by someone else)."""
    os.makedirs(outside(root), exist_ok=True)
    folder = views.views_folder(root, "kernels")
    os.symlink(os.path.join(outside(root), "target.py"), os.path.join(folder, "linked_views_cluster1.py"))


linked_views = server_fixture(prepare=view_linked_outside)


def statuses(result: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for m in result.get("models", []) for c in m.get("clusters", [])}


def progress_kinds(client: Client, since: set) -> list[list[str]]:
    return [
        [type(v).__name__ for v in values] for token, values in client.progress_reports.items() if token not in since
    ]


async def test_the_server_advertises_its_commands(client: Client):
    commands = client.init_result.capabilities.execute_command_provider.commands
    assert {
        "fuselens.analyze",
        "fuselens.validateKernel",
        "fuselens.validateAll",
        "fuselens.showKernel",
        "fuselens.writeKernelModule",
        "fuselens.validationResults",
    } <= set(commands)


async def test_validate_without_a_gpu_offers_the_interpreter(client: Client, analyzed: str):
    """No CUDA here: the server says so once, in the editor's words, and asks; answering runs the
    kernel in the Triton interpreter.  Progress shows only while work runs, not while it asks."""
    open_while_asked = []

    def answer(params):
        open_while_asked.extend(
            t for t, values in client.progress_reports.items() if type(values[-1]).__name__ != "WorkDoneProgressEnd"
        )
        return INTERPRET if INTERPRET in [a.title for a in params.actions or []] else None

    client.answer = answer
    asked, told, tokens = len(client.message_requests), len(client.messages), set(client.progress_reports)
    logged = len(client.log_messages)

    result = await client.command("fuselens.validateKernel", analyzed, "c0")

    (request,) = client.message_requests[asked:]
    assert [a.title for a in request.actions] == [INTERPRET, "Always check in the interpreter"]
    assert "No CUDA GPU" in request.message and "fuselens.remoteRunner" in request.message
    assert "--interpret" not in request.message and request.message.count("CUDA") == 1, request.message
    assert not open_while_asked
    assert result["mode"] == "interpret"
    assert statuses(result) == {"c0": "verified"}
    assert result["models"][0]["clusters"][0]["max_abs"] is not None  # it compared real numbers
    summary = client.messages[told:][-1]
    assert summary.type == lsp.MessageType.Info
    assert "in the interpreter: 1 verified" in summary.message and len(summary.message) < 100, summary.message
    lines = [m.message for m in client.log_messages[logged:]]
    assert any(
        line.startswith("validation of example_net.py: ") and "c0 verified (max err" in line for line in lines
    ), lines
    # Work-done progress: created by the server, then begin ... report ... end, once per run.
    for kinds in progress_kinds(client, tokens):
        assert kinds[0] == "WorkDoneProgressBegin" and kinds[-1] == "WorkDoneProgressEnd"
    assert any("WorkDoneProgressReport" in kinds for kinds in progress_kinds(client, tokens))


async def test_declining_the_interpreter_reports_the_missing_gpu(client: Client, analyzed: str):
    client.answer = lambda params: None  # the user dismisses the question
    asked, told = len(client.message_requests), len(client.messages)
    result = await client.command("fuselens.validateKernel", analyzed, "c1")
    assert len(client.message_requests) == asked + 1
    assert any("no CUDA device" in p for p in result["problems"]), result
    assert statuses(result) == {}  # nothing ran
    summary = client.messages[told:][-1]
    assert summary.type == lsp.MessageType.Warning and "no CUDA device" in summary.message
    assert len(client.message_requests) == asked + 1  # asked once: the summary says it, no second prompt


async def test_validate_in_the_interpreter_when_asked_to(client: Client, analyzed: str):
    asked = len(client.message_requests)
    result = await client.command("fuselens.validateKernel", analyzed, "c2", {"interpret": True})
    assert len(client.message_requests) == asked  # nothing to ask
    assert statuses(result) == {"c2": "verified"}
    # Its largest error as a share of the tolerance the check used: under 1, as "verified" says; the
    # chart's bar is that share.
    (check,) = [c for m in result["models"] for c in m["clusters"]]
    assert 0 <= check["tolerance_ratio"] <= 1, check
    bars = next(t for t in result["results_view"]["models"][0]["chart"]["data"] if t["type"] == "bar")
    assert bars["y"] == [check["tolerance_ratio"] or None], bars  # (an exact match has no bar on a log axis)
    # The results table the editors show, with the torch.compile mode its timings would compare with.
    table = result["results_markdown"].splitlines()
    assert table[0].startswith("### ExampleNet at ") and "Triton interpreter" in table[0]
    assert "torch.compile (default) µs" in table[2]
    (row,) = [line for line in table if re.match(r"\| c\d+ \|", line)]
    assert row.startswith("| c2 | tanh → mul → softmax | verified | ") and row.endswith("| — | — |")


async def test_a_whole_model_check_that_ends_in_an_error_says_why(client: Client):
    """The whole-model check cannot build its copy (here the `<model>_kernels.py` beside the file is
    the user's own): the notification gives the reason, and so do the log it points to and the
    results view, rather than a bare "whole model: error"."""
    client.write("own_module_net_kernels.py", "def mine():\n    pass\n")  # not one fuselens wrote
    uri = client.open("own_module_net.py", example_text())
    await client.diagnostics_of(uri, 1)
    told, logged = len(client.messages), len(client.log_messages)
    result = await client.command("fuselens.validateAll", uri, None, {"interpret": True})
    assert statuses(result) == {"c0": "verified", "c1": "verified", "c2": "verified"}
    assert result["models"][0]["model"]["status"] == "error"
    reason = "own_module_net_kernels.py exists and was not written by fuselens"

    (toast,) = client.messages[told:]
    assert toast.type == lsp.MessageType.Warning
    assert (
        "3 verified; ExampleNet as a whole: error: the kernel module beside the file cannot be read: " in toast.message
    )
    assert reason in toast.message and toast.message.endswith("(details in the fuselens log)"), toast.message
    (log,) = [m.message for m in client.log_messages[logged:] if m.message.startswith("validation of own_module_net")]
    assert "whole model: error" in log and reason in log, log
    whole = result["results_view"]["models"][0]["whole_model"]
    assert whole.startswith("whole model with c0, c1, c2 applied: error (the kernel module beside") and reason in whole
    assert whole in result["results_markdown"]


async def test_a_validation_comes_with_its_results_view_and_the_files_earlier_runs(client: Client):
    """The results view the editors draw: the table's rows, the chart and, from the second run on,
    the earlier runs of the same file, kept by the server; asked for later, the last run's view."""
    uri = client.open("history_net.py", example_text())
    await client.diagnostics_of(uri, 1)
    none_yet = await client.command("fuselens.validationResults", uri)
    assert none_yet["results_view"] is None and none_yet["message"] == "no validation of history_net.py yet"

    first = (await client.command("fuselens.validateKernel", uri, "c0", {"interpret": True}))["results_view"]
    assert first["earlier_runs"] == 0 and first["time"].endswith("Z")
    (model,) = first["models"]
    assert model["rows"][0][:3] == ["c0", "mul → relu → add", "verified"]
    numerics = ["max |error| / tolerance", "tolerance: atol + rtol·|expected|"]  # no timings: errors against tolerances
    assert [t["name"] for t in model["chart"]["data"]] == numerics
    assert model["history"]["rows"] == []

    second = await client.command("fuselens.validateKernel", uri, "c0", {"interpret": True})
    view = second["results_view"]
    assert view["earlier_runs"] == 1
    (model,) = view["models"]
    assert model["history"]["columns"] == ["run", "device", "torch", "revision", "c0", "whole model"]
    latest, before = model["history"]["rows"]
    assert latest[0] == "latest" and before[1] == "Triton interpreter" and before[4].startswith("err ")
    earlier = [t["name"] for t in model["chart"]["data"]][2]  # the earlier run's series
    assert earlier.startswith("max |error| / tolerance, "), earlier
    assert "#### Earlier runs of this file" in second["results_markdown"]  # (Neovim's :FuselensResults)

    shown = await client.command("fuselens.validationResults", uri)  # the palette's "Show validation results"
    assert shown["results_view"] == view and shown["results_markdown"] == second["results_markdown"]


async def test_validate_all_from_the_code_lens(client: Client, analyzed: str):
    lens = next(lens for lens in await client.code_lenses(analyzed) if lens.command.title == "Validate all")
    client.answer = lambda params: INTERPRET
    result = await client.command(lens.command.command, *lens.command.arguments)
    assert statuses(result) == {"c0": "verified", "c1": "verified", "c2": "verified"}
    assert result["models"][0]["model"]["status"] == "matches"  # the whole model, every kernel applied


async def test_validate_rejects_bad_arguments(client: Client, analyzed: str):
    with pytest.raises(JsonRpcException, match=r"no cluster c7 in example_net\.py"):
        await client.command("fuselens.validateKernel", analyzed, "c7")
    with pytest.raises(JsonRpcException, match=r"argument 'cluster' must be str"):
        await client.command("fuselens.validateKernel", analyzed, 3)
    with pytest.raises(JsonRpcException, match="missing argument 'cluster'"):
        await client.command("fuselens.validateKernel", analyzed)
    with pytest.raises(JsonRpcException, match="not a Python file URI"):
        await client.command("fuselens.validateKernel", "file:///tmp/notes.txt", "c0")


async def test_analyze_reschedules_the_document(client: Client):
    uri = client.open("analyze_me.py", example_text())
    await client.diagnostics_of(uri, 1)
    seen = len(client.published)
    assert await client.command("fuselens.analyze", uri) == {"scheduled": True}
    diags = await client.diagnostics_of(uri, 1, after=seen)
    assert len([d for d in diags if d.message.startswith("fusable:")]) == 3
    with pytest.raises(JsonRpcException, match="is not open"):
        await client.command("fuselens.analyze", uri_of(client.path("gpt.py")))


async def test_show_kernel_opens_that_kernel_read_only_outside_the_project(client: Client, analyzed: str):
    before = sorted(os.listdir(client.root))
    shown = len(client.shown_documents)
    result = await client.command("fuselens.showKernel", analyzed, "c1")
    assert result["path"] == os.path.join(views.views_folder(client.root, "kernels"), "example_net_cluster1.py")
    assert result["kernels"] == ["cluster1"]
    with open(result["path"], encoding="utf-8") as fh:
        assert fh.read() == result["text"]
    assert os.stat(result["path"]).st_mode & 0o222 == 0  # read-only: an edit there would be lost
    text = result["text"]
    assert "\ndef cluster1(x, weight, bias):" in text and "@triton.jit" in text and "_cluster1_launch" in text
    assert "cluster0" not in text and "cluster2" not in text  # that cluster's kernel only
    compile(text, result["path"], "exec")
    assert sorted(os.listdir(client.root)) == before  # nothing written into the project
    # The client is asked to show it, at the kernel's definition.
    (show,) = client.shown_documents[shown:]
    assert show.uri == uri_of(result["path"]) and show.take_focus
    line = result["text"].split("\n")[show.selection.start.line]
    assert line.startswith("def cluster1(")


async def test_an_opened_kernel_view_is_not_analyzed_as_a_model(client: Client, analyzed: str):
    """The kernel the editor opens is generated code to read: it gets no analysis, no diagnostics
    and no "0 clusters" status, while the user's files still do."""
    result = await client.command("fuselens.showKernel", analyzed, "c1")
    view = client.open(result["path"])
    mine = client.open("another_model.py", example_text())
    assert await client.diagnostics_of(mine)  # analyzed after the view was opened
    assert client.published_for(view) == []


async def test_show_kernels_for_the_model(client: Client, analyzed: str):
    result = await client.command("fuselens.showKernel", analyzed, "ExampleNet")
    assert result["kernels"] == ["cluster0", "cluster1", "cluster2"]
    assert os.path.basename(result["path"]) == "example_net_kernels.py" and "\ndef cluster2(" in result["text"]
    again = await client.command("fuselens.showKernel", analyzed, "ExampleNet")  # over the read-only view
    assert again["path"] == result["path"] and again["text"] == result["text"]
    result = await client.command("fuselens.showKernel", analyzed)
    assert result["kernels"] == ["cluster0", "cluster1", "cluster2"]
    with pytest.raises(JsonRpcException, match="no model or cluster 'Nope'"):
        await client.command("fuselens.showKernel", analyzed, "Nope")


async def test_commands_need_an_analysis(client: Client):
    uri = client.open("not_yet.py", example_text())
    client.change(uri, example_text() + "\n")  # typed, not saved: nothing is analyzed for this version
    with pytest.raises(JsonRpcException, match="open or save it first"):
        await client.command("fuselens.showKernel", uri)
    version = client.save_text(uri, client.texts[uri])
    await client.diagnostics_of(uri, version)
    assert (await client.command("fuselens.showKernel", uri))["kernels"] == ["cluster0", "cluster1", "cluster2"]


async def test_show_kernel_writes_nothing_through_a_linked_view(linked_views: Client):
    uri = linked_views.open("linked_views.py", example_text())
    await linked_views.diagnostics_of(uri, 1)
    with pytest.raises(JsonRpcException, match=r"linked_views_cluster1.py is a symbolic link"):
        await linked_views.command("fuselens.showKernel", uri, "c1")
    assert os.listdir(outside(linked_views.root)) == []


# A server of its own: the choice holds for the rest of the server's session, and the other tests of
# the module, in whatever order they run, must still be asked.
remembering = server_fixture()


async def test_always_the_interpreter_is_remembered(remembering: Client):
    client = remembering
    analyzed = client.open("example_net.py")
    await client.diagnostics_of(analyzed, 1)
    client.answer = lambda params: "Always check in the interpreter"
    asked = len(client.message_requests)
    first = await client.command("fuselens.validateKernel", analyzed, "c1")
    assert statuses(first) == {"c1": "verified"} and len(client.message_requests) == asked + 1
    again = await client.command("fuselens.validateKernel", analyzed, "c2")
    assert statuses(again) == {"c2": "verified"} and again["mode"] == "interpret"
    assert len(client.message_requests) == asked + 1  # not asked again
