"""Server settings: every number a client or a workspace sets is bounded to what the worker can keep."""

from __future__ import annotations

import pytest

from fuselens.server.settings import Settings, merge


@pytest.mark.parametrize(
    "worker, problem",
    [
        ({"timeoutSeconds": 1e12}, "worker.timeoutSeconds must be a number of seconds from 0.1 to 86400"),
        ({"timeoutSeconds": 0.001}, "worker.timeoutSeconds must be a number of seconds from 0.1 to 86400"),
        ({"timeoutSeconds": float("inf")}, "worker.timeoutSeconds must be a number of seconds"),
        ({"timeoutSeconds": float("nan")}, "worker.timeoutSeconds must be a number of seconds"),
        ({"validateTimeoutSeconds": -5}, "worker.validateTimeoutSeconds must be a number of seconds"),
        ({"memoryMb": 10**9}, "worker.memoryMb must be an integer from 256 to 1048576 (MB)"),
        ({"memoryMb": 16}, "worker.memoryMb must be an integer from 256 to 1048576 (MB)"),
        ({"memoryMb": True}, "worker.memoryMb must be an integer"),
    ],
)
def test_an_out_of_range_worker_limit_is_named_and_the_default_kept(worker, problem):
    settings, problems = merge(Settings(), {"worker": worker}, "initializationOptions")
    assert len(problems) == 1 and problem in problems[0], problems
    assert settings.worker.timeout_seconds == 60.0 and settings.worker.memory_mb == 8192


def test_limits_inside_the_bounds_are_kept():
    settings, problems = merge(
        Settings(), {"worker": {"timeoutSeconds": 0.5, "memoryMb": 65536}, "peakGbps": 4800}, "workspace/configuration"
    )
    assert problems == []
    assert (settings.worker.timeout_seconds, settings.worker.memory_mb, settings.peak_gbps) == (0.5, 65536, 4800.0)


def test_a_peak_bandwidth_past_any_device_is_refused():
    settings, problems = merge(Settings(), {"peakGbps": 1e300}, "workspace/configuration")
    assert settings.peak_gbps is None and "from 1 to 100000" in problems[0]


@pytest.mark.parametrize("setting", ["remoteRunner", "remoteProfiler"])
@pytest.mark.parametrize(
    "template, fault",
    [
        ("ssh gpu fuselens profile {file} {0}", "has the field {0}; only {file} and {json} are filled in"),
        ("ssh gpu fuselens profile {file} }", "Single '}' encountered"),
        ("ssh gpu 'fuselens profile {file}", "cannot be split into words: no closing quotation"),
        ("ssh gpu fuselens profile --json {json!r} {file}", "{json} takes no format or conversion"),
        ("ssh gpu fuselens profile", "has no {file} for the model's path"),
        ("", "is empty"),
    ],
)
def test_each_remote_template_is_checked_when_read_and_named_as_its_own_setting(setting, template, fault):
    good = "ssh gpu fuselens validate {file} --json {json}"
    before, _ = merge(Settings(), {"remoteRunner": good, "remoteProfiler": good}, "initializationOptions")
    settings, problems = merge(before, {setting: template}, "settings")
    (problem,) = problems
    assert problem.startswith(f"settings: fuselens.{setting}: ") and fault in problem, problem
    other = {"remoteRunner": "remoteProfiler", "remoteProfiler": "remoteRunner"}[setting]
    assert other not in problem
    assert (settings.remote_runner, settings.remote_profiler) == (good, good)  # the bad one is not taken


def test_good_remote_templates_are_kept():
    runner, profiler = "sh -c 'fuselens validate \"$1\"' _ {file}", "ssh gpu fuselens profile {file} --json {json}"
    settings, problems = merge(Settings(), {"remoteRunner": runner, "remoteProfiler": profiler}, "settings")
    assert problems == [] and (settings.remote_runner, settings.remote_profiler) == (runner, profiler)
