"""Language server, settings: initializationOptions, workspace/configuration, bad values."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types as lsp

from lsp_helpers import Client, example_text, replace_line, server_fixture, time_limit

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Bad values in initializationOptions; good ones through workspace/configuration (which wins).
client = server_fixture(
    init_options={"workspaceTrusted": True, "settings": {"device": "tpu", "worker": {"timeoutSeconds": -1}}},
    configuration={
        "fuselens": {
            "severity": "warning",
            "show": ["clusters", "problems"],
            "inlayHints": False,
            "worker": {"timeoutSeconds": 2},
        }
    },
)


def clusters(diags) -> list[lsp.Diagnostic]:
    return [d for d in diags if d.message.startswith("fusable:")]


async def test_bad_settings_are_named_and_ignored(client: Client):
    device = await client.wait_until(lambda: client.messages_matching("fuselens.device"), "the device warning")
    timeout = await client.wait_until(lambda: client.messages_matching("worker.timeoutSeconds"), "the timeout warning")
    for (message,) in (device, timeout):
        assert message.type == lsp.MessageType.Warning
        assert "initializationOptions" in message.message and "ignored" in message.message
    assert "must be one of h200, h100, a100, rtx4090" in device[0].message
    assert "must be a number of seconds from 0.1 to 86400" in timeout[0].message
    # ... and analysis keeps working with the defaults (and the good settings).
    uri = client.open("config_bad.py", example_text())
    assert len(clusters(await client.diagnostics_of(uri, 1))) == 3


async def test_workspace_configuration_is_asked_for_and_used(client: Client):
    assert client.configuration_requests >= 1
    uri = client.open("config_used.py", example_text())
    diags = await client.diagnostics_of(uri, 1)
    assert len(clusters(diags)) == 3 and len(diags) == 3  # "show" leaves out the softmax pattern hint
    assert {d.severity for d in diags} == {lsp.DiagnosticSeverity.Warning}  # "severity"
    assert "[dram-bound]" in diags[0].message  # the default device (h200): "tpu" was ignored
    assert await client.inlay_hints(uri) == []  # "inlayHints": false
    titles = [lens.command.title for lens in await client.code_lenses(uri)]
    assert titles[1:] == ["Validate all", "Show kernels", "Profile", "Probe"]  # "codeLens" left on


async def test_worker_timeout_from_workspace_configuration(client: Client):
    # A forward() that takes 40 s: analyzed to the end under the 60 s default, cut off under the 2 s set.
    uri = client.open("config_timeout.py", replace_line(example_text(), 19, "        __import__('time').sleep(40)"))
    (error,) = await client.diagnostics_of(uri, 1)
    assert error.code == "timeout" and error.range.start.line == 18
    assert "still running line 19" in error.message
    client.close(uri)  # not to be analyzed again when the settings change


@pytest.mark.timing
async def test_worker_timeout_from_workspace_configuration_is_kept_to(client: Client):
    loop = asyncio.get_running_loop()
    started = loop.time()
    uri = client.open("config_timeout_timed.py", replace_line(example_text(), 19, "        while x is not None: pass"))
    (error,) = await client.diagnostics_of(uri, 1)
    assert error.code == "timeout"
    assert loop.time() - started < 2 + time_limit(8)  # the configured 2 s, and a margin
    client.close(uri)  # not to be analyzed again when the settings change


async def test_changed_configuration_is_reread_and_reapplied(client: Client):
    uri = client.open("config_change.py", example_text())
    await client.diagnostics_of(uri, 1)
    asked, seen = client.configuration_requests, len(client.published)

    client.set_configuration(
        {"severity": "hint", "patternSeverity": "warning", "device": "a100", "show": ["clusters", "patterns"]},
        section="fuselens",
    )
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings=None))
    diags = await client.diagnostics_of(uri, 1, after=seen)  # the open document is analyzed again
    assert client.configuration_requests > asked
    assert {d.severity for d in clusters(diags)} == {lsp.DiagnosticSeverity.Hint}
    patterns = [d for d in diags if str(d.code).startswith("pattern:")]
    assert patterns and {d.severity for d in patterns} == {lsp.DiagnosticSeverity.Warning}  # in a Problems panel
    assert await client.inlay_hints(uri) != []  # no longer switched off


async def test_a_bad_value_from_workspace_configuration_is_named(client: Client):
    uri = client.open("config_bad_later.py", example_text())
    await client.diagnostics_of(uri, 1)
    seen = len(client.published)
    client.set_configuration({"device": "tpu", "codeLens": "yes"}, section="fuselens")
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings=None))
    (bad_lens,) = await client.wait_until(lambda: client.messages_matching("fuselens.codeLens"), "the warning")
    assert bad_lens.type == lsp.MessageType.Warning and "must be true or false" in bad_lens.message
    (bad_device,) = [m for m in client.messages_matching("fuselens: settings: fuselens.device")]
    assert "must be one of" in bad_device.message
    assert len(clusters(await client.diagnostics_of(uri, 1, after=seen))) == 3  # still analyzing
    assert len(client.messages_matching("initializationOptions: fuselens.device")) == 1  # told once, not per reload
