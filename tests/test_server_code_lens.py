"""Language server, code lenses: a summary over each analyzed model class, with its commands."""

from __future__ import annotations

import pytest
from lsprotocol import types as lsp

from lsp_helpers import MODEL_LINE, Client, example_text, server_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()


async def test_lenses_on_the_model_class_line(client: Client):
    uri = client.open("example_net.py")
    await client.diagnostics_of(uri, 1)
    lenses = await client.code_lenses(uri)
    assert [lens.command.title for lens in lenses] == [
        "3 fusable clusters · 576 MB of 866 MB avoidable · 3 applicable",
        "Validate all",
        "Show kernels",
        "Profile",
        "Probe",
    ]
    line = example_text().split("\n")[MODEL_LINE - 1]
    for lens in lenses:
        assert lens.range == lsp.Range(lsp.Position(MODEL_LINE - 1, 0), lsp.Position(MODEL_LINE - 1, len(line)))
    summary, validate, show, profile, probe = (lens.command for lens in lenses)
    assert (validate.command, list(validate.arguments)) == ("fuselens.validateAll", [uri, "ExampleNet"])
    assert (show.command, list(show.arguments)) == ("fuselens.showKernel", [uri, "ExampleNet"])
    assert (profile.command, list(profile.arguments)) == ("fuselens.profile", [uri, "ExampleNet"])
    assert (probe.command, list(probe.arguments)) == ("fuselens.probe", [uri, "ExampleNet"])
    assert summary.command == "fuselens.showKernel"
    # The lens commands are the server's own.
    assert {c.command for c in (summary, validate, show, profile, probe)} <= set(
        client.init_result.capabilities.execute_command_provider.commands
    )
    result = await client.command(show.command, *show.arguments)
    assert result["kernels"] == ["cluster0", "cluster1", "cluster2"]


async def test_one_set_of_lenses_per_model(client: Client):
    second = example_text().split("\n")[10:]  # the class, once more, under another name
    text = (
        example_text()
        + "\n\n"
        + "\n".join(second).replace("ExampleNet", "OtherNet").replace("input=(16384, 1024)", "input=(4096, 1024)")
    )
    uri = client.open("lens_two_models.py", text)
    await client.diagnostics_of(uri, 1)
    lenses = await client.code_lenses(uri)
    other = text.split("\n").index("class OtherNet(nn.Module):  # fuselens: input=(4096, 1024) float32")
    assert [(lens.range.start.line, lens.command.title) for lens in lenses] == [
        (MODEL_LINE - 1, "3 fusable clusters · 576 MB of 866 MB avoidable · 3 applicable"),
        (MODEL_LINE - 1, "Validate all"),
        (MODEL_LINE - 1, "Show kernels"),
        (MODEL_LINE - 1, "Profile"),
        (MODEL_LINE - 1, "Probe"),
        (other, "3 fusable clusters · 144 MB of 218 MB avoidable · 3 applicable"),
        (other, "Validate all"),
        (other, "Show kernels"),
        (other, "Profile"),
        (other, "Probe"),
    ]
    assert [list(lens.command.arguments)[1] for lens in lenses] == ["ExampleNet"] * 5 + ["OtherNet"] * 5


async def test_a_model_without_inputs_has_no_lens_but_a_hint(client: Client):
    text = example_text().replace("  # fuselens: input=(16384, 1024) float32", "")
    uri = client.open("lens_no_inputs.py", text)
    diags = await client.diagnostics_of(uri, 1)
    assert await client.code_lenses(uri) == []
    (hint,) = diags
    assert hint.code == "no-inputs" and hint.severity == lsp.DiagnosticSeverity.Hint
    assert hint.range.start.line == MODEL_LINE - 1 and "no example inputs" in hint.message


async def test_a_model_with_nothing_to_fuse_says_so(client: Client):
    text = (
        "import torch.nn as nn\n\n\n"
        "class Projection(nn.Module):  # fuselens: input=(64, 128) float32\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(128, 128)\n\n"
        "    def forward(self, x):\n        return self.fc(x)\n"
    )
    uri = client.open("lens_nothing_to_fuse.py", text)
    await client.diagnostics_of(uri, 1)
    lens, profile, probe = await client.code_lenses(uri)  # nothing to validate or show, but time to measure
    assert profile.command.title == "Profile" and probe.command.title == "Probe"
    assert lens.command.title.startswith("no fusable clusters · forward() moves "), lens.command.title
    assert lens.range.start.line == 3
