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
