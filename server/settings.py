"""Server settings: typed, validated, merged from the places a user sets them.

Sources, later wins: defaults, `[tool.fuselens]` in the workspace's pyproject.toml
(the device profile only), the client's `initializationOptions`,
then `workspace/configuration` (section "fuselens").  A bad value is reported by key
and replaced by its default; the rest keeps working.

The settings are one typed tree (`Settings`, its `worker`), frozen: `merge` is the one converter from
what a source sends to that tree, and makes a new tree each time, so that what a request or a job took
as its settings never changes under it.

Trust is deliberately *not* a setting here: see `trust.py`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from fuselens.contracts.config import ConfigError, ModelSettings, model_settings
from fuselens.contracts.options import DEVICE_PROFILES, AnalyzeOptions
from fuselens.contracts.plain import to_plain
from fuselens.worker.protocol import MAX_MEMORY_MB, MAX_SECONDS, MIN_MEMORY_MB, MIN_SECONDS

from .runner_template import template_fault

SEVERITIES = ("error", "warning", "information", "hint")
KINDS = ("clusters", "patterns", "rejections", "breaks", "problems")
DEVICES = DEVICE_PROFILES

# Bounds on every number a client or a workspace can set: a job's limits are the ones the worker
# keeps (`worker/protocol.py`: a poll cannot wait 1e12 s; a job cannot start in a millisecond).
MIN_TIMEOUT_S, MAX_TIMEOUT_S = MIN_SECONDS, MAX_SECONDS
MIN_PEAK_GBPS, MAX_PEAK_GBPS = 1.0, 100000.0


def _number_between(value: Any, low: float, high: float) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    )


@dataclass(frozen=True)
class WorkerSettings:
    python: str | None = None  # interpreter to run workers with (the user's venv); None: the server's
    timeout_seconds: float = 60.0
    memory_mb: int = 8192
    validate_timeout_seconds: float = 600.0


@dataclass(frozen=True)
class Settings:
    device: str = "h200"
    peak_gbps: float | None = None
    severity: str = "information"  # for cluster diagnostics
    pattern_severity: str = "hint"  # for pattern diagnostics ("information" or above lists them in a Problems panel)
    show: list[str] = field(default_factory=lambda: ["clusters", "patterns", "breaks", "problems"])
    inlay_hints: bool = True
    code_lens: bool = True
    compare_inductor: bool = True  # run torch.compile in the background and compare its fusions
    models: dict[str, ModelSettings] = field(default_factory=dict)  # class -> {inputs, dtype, init, param_dtype, dims}
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    remote_runner: str | None = None  # e.g. "ssh gpu fuselens validate {file} --json {json}"
    remote_profiler: str | None = None  # e.g. "ssh gpu fuselens profile {file} --json {json}"

    def analyze_options(self, text: str | None = None) -> AnalyzeOptions:
        """What the worker analyzes with: these settings, and the editor's `text` of the file."""
        return AnalyzeOptions(device=self.device, peak_gbps=self.peak_gbps, models=dict(self.models), source_text=text)

    def analysis_key(self) -> str:
        """What of these settings an analysis depends on, as one string (to key what is kept of one)."""
        return json.dumps(to_plain(self.analyze_options()), sort_keys=True, default=str)


_ALIASES = {  # accept the camelCase spellings editors use
    "peakGbps": "peak_gbps",
    "inlayHints": "inlay_hints",
    "codeLens": "code_lens",
    "patternSeverity": "pattern_severity",
    "compareInductor": "compare_inductor",
    "remoteRunner": "remote_runner",
    "remoteProfiler": "remote_profiler",
    "timeoutSeconds": "timeout_seconds",
    "memoryMb": "memory_mb",
    "validateTimeoutSeconds": "validate_timeout_seconds",
}


def _key(name: str) -> str:
    return _ALIASES.get(name, name)


def merge(base: Settings, data: dict[str, Any] | None, where: str) -> tuple[Settings, list[str]]:
    """`base` updated with `data`, as new settings (`base` is unchanged); returns (settings, problems),
    each problem naming its key."""
    problems: list[str] = []
    if not data:
        return base, problems
    if not isinstance(data, dict):
        return base, [f"{where}: settings must be an object, got {type(data).__name__}"]
    known = {f.name for f in fields(Settings)}
    for raw, value in data.items():
        key = _key(raw)
        if key in ("trusted", "trust", "workspaceTrusted", "trusted_folders", "trustedFolders"):
            continue  # trust never comes from settings a workspace could ship
        if key not in known:
            problems.append(f"{where}: unknown setting '{raw}'")
            continue
        try:
            base = _with(base, key, value)
        except _PartlyRead as exc:  # the worker's entries before the bad one are kept
            base = exc.settings
            problems.append(f"{where}: fuselens.{raw}: {exc}")
        except (TypeError, ValueError) as exc:
            problems.append(f"{where}: fuselens.{raw}: {exc}")
    return base, problems


def _with(s: Settings, key: str, value: Any) -> Settings:
    """`s` with the setting `key` set to `value` (TypeError, ValueError: why it cannot be)."""
    if key == "worker":
        return _with_worker(s, value)
    return replace(s, **{key: _value(s, key, value)})


def _value(s: Settings, key: str, value: Any) -> Any:
    """What the setting `key` becomes for `value` (TypeError, ValueError: why it cannot)."""
    if key == "device":
        if not isinstance(value, str) or value.lower().replace("-", "") not in DEVICES:
            raise ValueError(f"must be one of {', '.join(DEVICES)}")
        return value.lower().replace("-", "")
    if key == "peak_gbps":
        if value is not None and not _number_between(value, MIN_PEAK_GBPS, MAX_PEAK_GBPS):
            raise ValueError(f"must be a number of GB/s from {MIN_PEAK_GBPS:.0f} to {MAX_PEAK_GBPS:.0f}")
        return float(value) if value is not None else None
    if key in ("severity", "pattern_severity"):
        if value not in SEVERITIES:
            raise ValueError(f"must be one of {', '.join(SEVERITIES)}")
        return value
    if key == "show":
        if not isinstance(value, list) or any(v not in KINDS for v in value):
            raise ValueError(f"must be a list drawn from {', '.join(KINDS)}")
        return list(value)
    if key in ("inlay_hints", "code_lens", "compare_inductor"):
        if not isinstance(value, bool):
            raise TypeError("must be true or false")
        return value
    if key == "models":
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise ValueError("must map class names to {inputs, dtype, init, param_dtype, dims}")
        try:
            parsed = {name: model_settings(entry, f"models.{name}") for name, entry in value.items()}
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return {**s.models, **parsed}
    # remote_runner, remote_profiler
    if value is not None and not isinstance(value, str):
        raise TypeError("must be a command line containing {file}")
    if value is not None and (fault := template_fault(value)):
        raise ValueError(fault)
    return value


class _PartlyRead(ValueError):
    """A `worker` entry that cannot be read, with the settings its entries before it made."""

    def __init__(self, message: str, settings: Settings):
        super().__init__(message)
        self.settings = settings


def _with_worker(s: Settings, value: Any) -> Settings:
    """`s` with the `worker` entries of `value`, read in order up to the first bad one."""
    if not isinstance(value, dict):
        raise TypeError("must be an object")
    for raw, v in value.items():
        try:
            s = replace(s, worker=_worker_with(s.worker, _key(raw), v, raw))
        except (TypeError, ValueError) as exc:
            raise _PartlyRead(str(exc), s) from None
    return s


def _worker_with(w: WorkerSettings, key: str, value: Any, raw: str) -> WorkerSettings:
    if key == "python":
        if value is not None and not isinstance(value, str):
            raise TypeError(f"worker.{raw} must be a path to a Python interpreter")
        return replace(w, python=value or None)
    if key in ("timeout_seconds", "validate_timeout_seconds"):
        if not _number_between(value, MIN_TIMEOUT_S, MAX_TIMEOUT_S):
            raise ValueError(f"worker.{raw} must be a number of seconds from {MIN_TIMEOUT_S} to {MAX_TIMEOUT_S:.0f}")
        seconds = float(value)
        return (
            replace(w, timeout_seconds=seconds)
            if key == "timeout_seconds"
            else replace(w, validate_timeout_seconds=seconds)
        )
    if key == "memory_mb":
        if not isinstance(value, int) or isinstance(value, bool) or not MIN_MEMORY_MB <= value <= MAX_MEMORY_MB:
            raise ValueError(f"worker.{raw} must be an integer from {MIN_MEMORY_MB} to {MAX_MEMORY_MB} (MB)")
        return replace(w, memory_mb=value)
    raise ValueError(f"unknown setting 'worker.{raw}'")


def from_pyproject(table: dict[str, Any]) -> dict[str, Any]:
    """The settings [tool.fuselens] may give the server: the device profile.  Its `models` are
    not among them: the worker reads them from the pyproject.toml nearest each file, as the CLI
    does, so that a nested project's own table wins and is named as the source."""
    return {k: v for k, v in table.items() if k in ("device", "peak_gbps")}
