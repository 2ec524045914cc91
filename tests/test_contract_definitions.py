"""Each contract is defined once, and what spells it elsewhere agrees with that definition.

The settings and their bounds live in `server/settings.py` (the job limits in `worker/protocol.py`,
the device profiles in `contracts/options.py`); the VS Code manifest declares them again for the
settings editor, so it is checked against them here: a setting missing from it cannot be set from
VS Code's settings page, and a bound that differs lets a user type a value the server then ignores.
The command ids live in `contracts/commands.py`; the editor plugins spell them in their own
languages, and each one they send must be one the server answers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from fuselens.contracts.commands import SERVER_COMMANDS
from fuselens.contracts.options import DEVICE_PROFILES
from fuselens.server import settings as settings_mod
from fuselens.worker import protocol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EDITORS = os.path.join(ROOT, "editors")


def manifest_settings() -> dict:
    with open(os.path.join(EDITORS, "vscode", "package.json"), encoding="utf-8") as fh:
        return json.load(fh)["contributes"]["configuration"]["properties"]


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def test_every_server_setting_can_be_set_in_the_vscode_settings_editor_with_its_default():
    properties = manifest_settings()
    defaults = settings_mod.Settings()
    for field in dataclasses.fields(settings_mod.Settings):
        key = f"fuselens.{camel(field.name)}"
        assert key in properties, f"{key} is a server setting the VS Code manifest does not declare"
        value = getattr(defaults, field.name)
        if isinstance(value, (bool, int, float, str, list)) or value is None:
            assert properties[key].get("default") == value, key
    worker = properties["fuselens.worker"]["properties"]
    for field in dataclasses.fields(settings_mod.WorkerSettings):
        assert camel(field.name) in worker, f"worker.{camel(field.name)} is missing from the manifest"


def test_the_manifest_s_choices_and_bounds_are_the_server_s():
    properties = manifest_settings()
    assert tuple(properties["fuselens.device"]["enum"]) == DEVICE_PROFILES == settings_mod.DEVICES
    assert tuple(properties["fuselens.severity"]["enum"]) == settings_mod.SEVERITIES
    assert tuple(properties["fuselens.patternSeverity"]["enum"]) == settings_mod.SEVERITIES
    assert tuple(properties["fuselens.show"]["items"]["enum"]) == settings_mod.KINDS
    peak = properties["fuselens.peakGbps"]
    assert (peak["minimum"], peak["maximum"]) == (settings_mod.MIN_PEAK_GBPS, settings_mod.MAX_PEAK_GBPS)
    worker = properties["fuselens.worker"]["properties"]
    for key in ("timeoutSeconds", "validateTimeoutSeconds"):
        assert (worker[key]["minimum"], worker[key]["maximum"]) == (protocol.MIN_SECONDS, protocol.MAX_SECONDS), key
    assert (worker["memoryMb"]["minimum"], worker["memoryMb"]["maximum"]) == (
        protocol.MIN_MEMORY_MB,
        protocol.MAX_MEMORY_MB,
    )


def test_a_job_limit_the_settings_accept_is_one_the_worker_runs_under():
    """The server's bounds are the worker's: the least memory and time the settings take start a job."""
    least = protocol.Limits(settings_mod.MIN_TIMEOUT_S, settings_mod.MIN_MEMORY_MB)
    assert protocol.bounded(least) == least
    assert settings_mod.MAX_MEMORY_MB == protocol.MAX_MEMORY_MB


def test_the_cost_model_has_a_profile_for_each_device_a_user_can_choose():
    from fuselens.analysis.cost import DEVICES as COST_PROFILES

    assert tuple(COST_PROFILES) == DEVICE_PROFILES


PLUGIN_SOURCES = [
    os.path.join(EDITORS, "nvim", "lua", "fuselens", "init.lua"),
    os.path.join(EDITORS, "emacs", "fuselens-eglot.el"),
    *(os.path.join(EDITORS, "vscode", "src", f) for f in ("commands.ts", "status.ts", "client.ts")),
]


def sent_commands(path: str) -> set[str]:
    """The `fuselens.<name>` ids a plugin's source spells that are neither a setting nor a module of its own."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    ids = set(re.findall(r"[\"'](fuselens\.[a-z][A-Za-z]*)[\"']", text))
    settings = {key.split(".")[0] + "." + key.split(".")[1] for key in manifest_settings()}
    modules = {f"fuselens.{name[:-4]}" for name in os.listdir(os.path.join(EDITORS, "nvim", "lua", "fuselens"))}
    views = {"fuselens.results"}  # VS Code's webview type, not a command
    return ids - settings - modules - views


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=os.path.basename)
def test_each_command_an_editor_plugin_sends_is_one_the_server_answers(path):
    sent = sent_commands(path)
    assert sent, f"{path} names no command: the pattern no longer finds them"
    assert sent <= set(SERVER_COMMANDS), sorted(sent - set(SERVER_COMMANDS))
