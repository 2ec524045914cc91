"""Workspace commands: analyze now, validate kernels (with progress), profile the forward, show and
write kernels (their code generated first where the analysis left it out: `generation.py`).

Each command checks its arguments and takes its snapshot as the request arrives (`snapshot.py`), and
answers from that snapshot whatever happens to the document meanwhile.

Validation runs in the worker, like analysis.  On a machine without CUDA it says so and
offers the Triton interpreter instead (numerics only); a configured remote runner (a
command line with `{file}`, and optionally `{json}` for its result file) takes the job
to a GPU elsewhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.codegen import rewrites as rewrites_mod
from fuselens.contracts import commands as command_ids
from fuselens.contracts.options import AnalyzeOptions, ProfileOptions, ValidateOptions
from fuselens.contracts.plain import to_plain
from fuselens.contracts.probe import ProbeOptions, ProbeReport
from fuselens.contracts.probe_view import probe_view
from fuselens.contracts.profile import Profile
from fuselens.contracts.profile_view import profile_view
from fuselens.contracts.report import Report
from fuselens.contracts.results_view import results_view, view_markdown
from fuselens.contracts.validation import ValidationReport, step_errors
from fuselens.worker.protocol import Limits, ProbeJob, ProfileJob, ValidateJob

from . import history, views
from .editor import Progress
from .features.measured import time_label, where_measured
from .features.text import path_to_uri, uri_to_path
from .kernel_module import kernel_module_text
from .protocol import on_arrival
from .requests import report_with_code
from .runner import RemoteFailed
from .scheduler import Analysis
from .services import Services
from .snapshot import Snapshot
from .workers import JobFailed

INTERPRET = "Check numerics in the Triton interpreter"
ALWAYS_INTERPRET = "Always check in the interpreter"  # (for the rest of the session)

# How long writing the kernel module waits for a `fuselens apply` that is writing the same model (it
# holds the lock for milliseconds); longer is another program holding it, and the write is refused.
MODULE_LOCK_WAIT_S = 1.0


def _args(args: tuple[Any, ...], spec: list[tuple[str, type, bool]]) -> list[Any]:
    """Check positional command arguments against (name, type, required); a JSON-RPC error if wrong."""
    if len(args) > len(spec):
        raise JsonRpcInvalidParams.of(TypeError(f"expected at most {len(spec)} arguments, got {len(args)}"))
    out: list[Any] = []
    for i, (name, kind, required) in enumerate(spec):
        value = args[i] if i < len(args) else None
        if value is None:
            if required:
                raise JsonRpcInvalidParams.of(TypeError(f"missing argument '{name}'"))
            out.append(None)
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise JsonRpcInvalidParams.of(
                TypeError(f"argument '{name}' must be {kind.__name__}, got {type(value).__name__}")
            )
        out.append(value)
    return out


def _document_path(uri: str) -> str:
    path = uri_to_path(uri)
    if path is None or not path.endswith(".py"):
        raise JsonRpcInvalidParams.of(ValueError(f"not a Python file URI: {uri!r}"))
    return path


def _open_document_path(snapshot: Snapshot) -> str:
    """The path of the open document of `snapshot`: a command that runs its model asks about no other."""
    path = _document_path(snapshot.uri)
    if snapshot.version is None:
        raise JsonRpcInvalidParams.of(ValueError(f"{snapshot.uri} is not open"))
    return path


def register_commands(server: LanguageServer, services: Services) -> None:
    """Each command checks its arguments and takes its snapshot as the request arrives (`on_arrival`),
    and returns the coroutine that answers it."""
    state = services.state

    def command(name: str) -> Callable[[Callable[..., Coroutine[Any, Any, Any]]], Any]:
        return lambda handler: server.command(name)(on_arrival(handler))

    @command(command_ids.ANALYZE)
    def analyze(*args):
        (uri,) = _args(args, [("uri", str, True)])
        snapshot = state.snapshot(uri)
        return _analyze(services, _open_document_path(snapshot), snapshot)

    @command(command_ids.VALIDATE_KERNEL)
    def validate_kernel(*args):
        uri, cluster, options = _args(args, [("uri", str, True), ("cluster", str, True), ("options", dict, False)])
        return _validate(services, state.snapshot(uri), [cluster], None, options or {})

    @command(command_ids.VALIDATE_ALL)
    def validate_all(*args):
        uri, model, options = _args(args, [("uri", str, True), ("model", str, False), ("options", dict, False)])
        if (options or {}).get("probe"):  # the opportunities a probe names, measured (`fuselens validate --probe`)
            return _probe(services, state.snapshot(uri), model, measure=True)
        return _validate(services, state.snapshot(uri), None, model, options or {})

    @command(command_ids.PROFILE)
    def profile(*args):
        uri, model = _args(args, [("uri", str, True), ("model", str, False)])
        return _profile(services, state.snapshot(uri), model)

    @command(command_ids.PROBE)
    def probe(*args):
        uri, model = _args(args, [("uri", str, True), ("model", str, False)])
        return _probe(services, state.snapshot(uri), model)

    @command(command_ids.VALIDATION_RESULTS)
    def validation_results(*args):
        (uri,) = _args(args, [("uri", str, True)])
        return _last_results(services, _document_path(uri))

    @command(command_ids.SHOW_KERNEL)
    def show_kernel(*args):
        uri, which = _args(args, [("uri", str, True), ("which", str, False)])
        return _show_kernel(services, state.snapshot(uri), which)

    @command(command_ids.SHOW_INDUCTOR_KERNEL)
    def show_inductor_kernel(*args):
        uri, cluster = _args(args, [("uri", str, True), ("cluster", str, True)])
        return _show_inductor(services, state.snapshot(uri), cluster)

    @command(command_ids.WRITE_KERNEL_MODULE)
    def write_module(*args):
        uri, version, ids = _args(args, [("uri", str, True), ("version", int, True), ("clusters", list, True)])
        return _write_module(services, state.snapshot(uri), version, ids)


async def _analyze(services: Services, path: str, snapshot: Snapshot) -> dict[str, Any]:
    folders = services.state.folders
    if not folders.trusted(path):
        return {"scheduled": False, "reason": "untrusted", "message": folders.untrusted(path)}
    services.analyzer.schedule(snapshot.uri)
    return {"scheduled": True}


def _analysis_for(snapshot: Snapshot) -> Analysis:
    analysis = snapshot.analysis
    if analysis is None:
        raise JsonRpcInvalidParams.of(ValueError(f"no analysis of {snapshot.uri} yet: open or save it first"))
    return analysis


def _untrusted(services: Services, path: str) -> dict[str, Any] | None:
    """A command's answer for a file outside the trusted folders (None for one inside)."""
    folders = services.state.folders
    return None if folders.trusted(path) else {"error": "untrusted", "message": folders.untrusted(path)}


def _job_options(snapshot: Snapshot, model: str | None) -> AnalyzeOptions:
    """The options a job that runs the file's models (or only `model`) takes: its analysis's."""
    options = snapshot.settings.analyze_options(_analysis_for(snapshot).text)
    if model is not None:
        options.model_class = model
    return options


async def _validate(
    services: Services, snapshot: Snapshot, clusters: list[str] | None, model: str | None, options: dict[str, Any]
) -> dict[str, Any]:
    path = _open_document_path(snapshot)
    folders, log = services.state.folders, services.log
    if not folders.trusted(path):
        return {"error": "untrusted", "message": folders.untrusted(path)}
    analysis = _analysis_for(snapshot)
    report = analysis.report
    if clusters is not None:
        known = {c.id for _, c in report.clusters()}
        missing = [c for c in clusters if c not in known]
        if missing:
            raise JsonRpcInvalidParams.of(ValueError(f"no cluster {', '.join(missing)} in {os.path.basename(path)}"))
    elif model is not None:
        clusters = [c.id for m in report.models if m.name == model for c in m.clusters]
        if not clusters:
            raise JsonRpcInvalidParams.of(ValueError(f"no analyzed model {model!r} with clusters"))
    interpret = bool(options.get("interpret")) or services.state.always_interpret
    what = ", ".join(clusters) if clusters and len(clusters) <= 3 else "kernels"
    name = os.path.basename(path)
    log.line(f"validating {what} of {name}{' in the Triton interpreter' if interpret else ''}")
    try:
        result = await _with_progress(
            services,
            snapshot,
            f"fuselens: validating {what}",
            _validation(services, snapshot, path, analysis.text, clusters, interpret),
        )
        if not interpret and result.needs_gpu:
            if snapshot.settings.remote_runner:
                log.line(f"no CUDA GPU here: validating {name} with the remote runner")
                result = await _with_progress(
                    services,
                    snapshot,
                    f"fuselens: validating {what} on the remote runner",
                    _remote(services, snapshot, path),
                )
            elif await _interpret_instead(services, snapshot):
                result = await _with_progress(
                    services,
                    snapshot,
                    f"fuselens: validating {what} in the interpreter",
                    _validation(services, snapshot, path, analysis.text, clusters, True),
                )
    except (JobFailed, RemoteFailed) as exc:
        log.line(f"validation of {what} of {name} did not run: {exc}")
        log.tell(f"fuselens: validation did not run: {exc}", lsp.MessageType.Warning)
        return {"error": exc.kind, "message": str(exc)}
    log.line(f"validation of {name}: {_summary(result)}")
    log.tell(_toast(result), lsp.MessageType.Info if result.ok else lsp.MessageType.Warning)
    return {**result.to_dict(), **_results(services, path, result)}


async def _profile(services: Services, snapshot: Snapshot, model: str | None) -> dict[str, Any]:
    """Run the file's forwards under the profiler in the worker (on CUDA where the worker has it, else
    on the CPU) and keep the profile for the hover, the inlay hints and the lenses."""
    path = _open_document_path(snapshot)
    log, settings = services.log, snapshot.settings
    if refused := _untrusted(services, path):
        return refused
    options = _job_options(snapshot, model)
    name = os.path.basename(path)
    what = model or name
    log.line(f"profiling {model or 'the models'} of {name}")
    w = settings.worker
    remote = settings.remote_profiler
    # With a remote profiler, the worker profiles only on a GPU of its own: a CPU profile here is
    # not what the user set one up for.
    profile_options = ProfileOptions(device="cuda" if remote else "")
    progress = await services.editor.progress(snapshot.client, f"fuselens: profiling {what}")
    try:
        async with services.admission.turn():
            report: Report = await services.worker.run(
                ProfileJob(path, options, profile_options),
                Limits(w.validate_timeout_seconds, w.memory_mb),
                on_progress=lambda message, fraction: progress.report(message, fraction),
            )
        if remote and report.profile is not None and report.profile.problems:
            log.line(f"no CUDA GPU here: profiling {name} with the remote profiler")
            report = await services.remote.profile(remote, path, w.validate_timeout_seconds, progress.report)
    except (JobFailed, RemoteFailed) as exc:
        message = _profile_failure(snapshot, what, exc)
        log.line(message)
        log.tell(f"fuselens: {message}", lsp.MessageType.Error)
        return {"error": exc.kind, "message": message}
    finally:
        progress.end()
    if report.problems or report.profile is None or report.profile.problems:
        message = (
            report.problems[0].message
            if report.problems
            else report.profile.problems[0]
            if report.profile is not None and report.profile.problems
            else "nothing was profiled"
        )
        log.line(f"profile of {name} did not run: {message}")
        log.tell(f"fuselens: profiling {what} did not run: {message}", lsp.MessageType.Error)
        return {"error": "problem", "message": message}
    profile = report.profile
    services.state.profiles.keep(path, report.source_sha256, profile)
    services.analyzer.refresh_views()
    summary = _profile_summary(profile)
    log.line(f"profile of {name}: {summary}")
    unprofiled = [m for m in profile.models if m.problem]
    if unprofiled:
        # Said as a failure, with what to do about it: a model a CPU does not profile wants a GPU.
        hint = "" if remote else f" {NO_GPU_PROFILE_HINT}" if profile.mode == "cpu" else ""
        everything = len(unprofiled) == len(profile.models)
        log.tell(
            f"fuselens: {summary.rstrip('.')}.{hint}", lsp.MessageType.Error if everything else lsp.MessageType.Warning
        )
    else:
        log.tell(f"fuselens: {summary}", lsp.MessageType.Info)
    analyzed = {m.name: [i.shape or [] for i in m.inputs] for m in report.models}
    view = profile_view(path, profile, report.libraries, analyzed)
    return {
        "profile": to_plain(profile),
        "results_view": to_plain(view),
        "results_markdown": view_markdown(view),
    }


async def _probe(services: Services, snapshot: Snapshot, model: str | None, measure: bool = False) -> dict[str, Any]:
    """Run the file's models on data in the worker with every GEMM site sketched (`fuselens probe`), and
    keep the probe for the hover and the lens; with `measure`, each opportunity is also made with
    PyTorch's kernels and measured against the dense GEMM (`fuselens validate --probe`)."""
    path = _open_document_path(snapshot)
    log, settings = services.log, snapshot.settings
    if refused := _untrusted(services, path):
        return refused
    analysis = _analysis_for(snapshot)
    options = _job_options(snapshot, model)
    name = os.path.basename(path)
    what = model or name
    doing = "measuring the opportunities of" if measure else "probing"
    log.line(f"{doing} {model or 'the models'} of {name}")
    w = settings.worker
    progress = await services.editor.progress(snapshot.client, f"fuselens: {doing} {what}")
    try:
        async with services.admission.turn():
            report: ProbeReport = await services.worker.run(
                ProbeJob(path, options, ProbeOptions(measure=measure)),
                Limits(w.validate_timeout_seconds, w.memory_mb),
                on_progress=lambda message, fraction: progress.report(message, fraction),
            )
    except JobFailed as exc:
        log.line(f"probe of {what} did not finish: {exc}")
        log.tell(f"fuselens: probing {what} did not finish: {exc}", lsp.MessageType.Error)
        return {"error": exc.kind, "message": str(exc)}
    finally:
        progress.end()
    problems = [*report.problems, *(f"{m.name}: {m.problem}" for m in report.models if m.problem)]
    if problems:
        log.line(f"probe of {name} did not run: {problems[0]}")
        log.tell(f"fuselens: probing {what} did not run: {problems[0]}", lsp.MessageType.Error)
        return {"error": "problem", "message": problems[0], "probe": report.to_dict()}
    services.state.probes.keep(path, analysis.report.source_sha256, report)
    services.analyzer.refresh_views()
    found = sum(len(s.opportunities) for m in report.models for s in m.sites)
    sites = sum(len(m.sites) for m in report.models)
    source = f" ({report.models[0].data_source})" if report.models else ""
    summary = f"probed {what}: {found} opportunities in {sites} GEMM sites{source}"
    if measure:
        summary += f"; {_measured_summary(report)}"
    log.line(summary)
    log.tell(f"fuselens: {summary}", lsp.MessageType.Info)
    view = probe_view(report, analysis.report.libraries)
    return {"probe": report.to_dict(), "results_view": to_plain(view), "results_markdown": view_markdown(view)}


def _measured_summary(report: ProbeReport) -> str:
    measured = [m for model in report.models for site in model.sites for m in site.measured]
    timed = sum(m.status == "timed" for m in measured)
    errors = sum(m.error is not None for m in measured)
    if not measured:
        return "nothing to measure"
    if timed:
        return f"{timed} of {len(measured)} measured on {report.measured_on}, timed against the dense GEMM"
    return f"the output error of {errors} of {len(measured)} measured on {report.measured_on} (timing needs a CUDA GPU)"


NO_GPU_PROFILE_HINT = "Set fuselens.remoteProfiler to profile it on a GPU machine."


def _profile_failure(snapshot: Snapshot, what: str, exc: JobFailed | RemoteFailed) -> str:
    """Why the profile of `what` did not run, in the words of profiling and of the settings that bound it
    (the worker's own message speaks of an analysis, the job it runs most)."""
    w = snapshot.settings.worker
    remote = snapshot.settings.remote_profiler
    hint = "Raise that limit" if remote else f"{NO_GPU_PROFILE_HINT[:-1]}, or raise that limit"
    if isinstance(exc, JobFailed) and exc.kind == "timeout":
        failure = exc.error
        where = f"; it was still running {os.path.basename(failure.file)}:{failure.line}" if failure.file else ""
        return (
            f"profiling {what} did not finish within {w.validate_timeout_seconds:g} s "
            f"(fuselens.worker.validateTimeoutSeconds){where}. {hint}."
        )
    if isinstance(exc, JobFailed) and exc.kind == "memory":
        return f"profiling {what} ran out of memory (fuselens.worker.memoryMb: {w.memory_mb} MB). {hint}."
    return f"profiling {what} did not run: {exc}"


def _profile_summary(profile: Profile) -> str:
    parts = []
    for m in profile.models:
        if m.problem:
            parts.append(f"{m.name} was not profiled: {m.problem}")
            continue
        share = m.attributed_us / m.forward_us if m.forward_us else 0.0
        text = f"{m.name} {time_label(m.forward_us)} per forward, {share:.0%} attributed"
        if m.clusters:
            text += f"; {m.clusters[0].id} takes {m.clusters[0].share:.0%}"
        parts.append(text)
    measured = any(not m.problem for m in profile.models)
    return "; ".join(parts) + (f" ({where_measured(profile)})" if measured else "")


def _results(services: Services, path: str, result: ValidationReport) -> dict[str, Any]:
    """The results view of `result` beside the file's earlier runs, as data (VS Code's webview) and as
    markdown (Neovim's :FuselensResults); a run that checked something is added to the history first."""
    latest, earlier = history.record(path, result, services.log.line)
    view = results_view(latest, earlier)
    return {"results_view": to_plain(view), "results_markdown": view_markdown(view)}


async def _last_results(services: Services, path: str) -> dict[str, Any]:
    """The results view of the last validation of `path` kept in its history, beside the runs before it."""
    runs = history.load(path, services.log.line)
    if not runs:
        return {"results_view": None, "message": f"no validation of {os.path.basename(path)} yet"}
    view = results_view(runs[-1], runs[:-1])
    return {"results_view": to_plain(view), "results_markdown": view_markdown(view)}


Work = Callable[[Progress], Awaitable[ValidationReport]]  # a validation, reporting to its progress


def _validation(
    services: Services, snapshot: Snapshot, path: str, text: str, clusters: list[str] | None, interpret: bool
) -> Work:
    return lambda progress: _run_validation(services, snapshot, path, text, clusters, interpret, progress)


def _remote(services: Services, snapshot: Snapshot, path: str) -> Work:
    runner, seconds = snapshot.settings.remote_runner or "", snapshot.settings.worker.validate_timeout_seconds
    return lambda progress: services.remote.validate(runner, path, seconds, progress.report)


async def _with_progress(services: Services, snapshot: Snapshot, title: str, work: Work) -> ValidationReport:
    """`work(progress)` under a work-done progress that lasts exactly as long as it runs."""
    progress = await services.editor.progress(snapshot.client, title)
    try:
        result = await work(progress)
    finally:
        progress.end()
    return result


async def _interpret_instead(services: Services, snapshot: Snapshot) -> bool:
    """Whether to check numerics in the interpreter, there being no GPU and no remote runner: asked
    once; "always" is kept for the rest of the session."""
    choice = await services.editor.ask(
        snapshot.client,
        "No CUDA GPU on this machine, so the kernels cannot be timed here. Check their numerics in the "
        "Triton interpreter, or set fuselens.remoteRunner to validate on a GPU machine.",
        [INTERPRET, ALWAYS_INTERPRET],
    )
    if choice == ALWAYS_INTERPRET:
        services.state.always_interpret = True
        services.log.line("no CUDA GPU: validations check numerics in the Triton interpreter from now on")
    return choice in (INTERPRET, ALWAYS_INTERPRET)


async def _run_validation(
    services: Services,
    snapshot: Snapshot,
    path: str,
    text: str,
    clusters: list[str] | None,
    interpret: bool,
    progress: Progress,
) -> ValidationReport:
    settings = snapshot.settings
    w = settings.worker
    job = ValidateJob(path, settings.analyze_options(text), ValidateOptions(interpret=interpret, clusters=clusters))
    async with services.admission.turn():
        result: ValidationReport = await services.worker.run(
            job,
            Limits(w.validate_timeout_seconds, w.memory_mb),
            on_progress=lambda message, fraction: progress.report(message, fraction),
        )
    return result


def _toast(result: ValidationReport) -> str:
    """A line short enough for a notification; the full summary goes to the log."""
    if result.problems:
        return (
            "fuselens: "
            + result.problems[0]
            + (f" (and {len(result.problems) - 1} more)" if len(result.problems) > 1 else "")
        )
    clusters = [c for m in result.models for c in m.clusters]
    counts: dict[str, int] = {}
    for c in clusters:
        counts[c.status] = counts.get(c.status, 0) + 1
    where = "in the interpreter" if result.mode == "interpret" else f"on {result.device or 'the GPU'}"
    text = ", ".join(f"{n} {status}" for status, n in counts.items()) or "nothing to validate"
    speedups = [c.timing.speedup_vs_compiled for c in clusters if c.timing and c.timing.speedup_vs_compiled]
    if speedups:
        text += f"; {min(speedups):.2f}–{max(speedups):.2f}× torch.compile"
    errors = step_errors(result)
    if errors:  # the first error's reason, whole: a status alone says nothing the user can act on
        text += f"; {errors[0]}" + (f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else "")
    return f"fuselens {where}: {text} (details in the fuselens log)"


def _summary(result: ValidationReport) -> str:
    if result.problems:
        return "fuselens: " + "; ".join(result.problems)
    parts = []
    where = "interpreter" if result.mode == "interpret" else result.device or "GPU"
    for m in result.models:
        for c in m.clusters:
            text = f"{c.id} {c.status}"
            if c.max_abs is not None:
                text += f" (max err {c.max_abs:.1e})"
            if c.timing and c.timing.speedup_vs_compiled:
                text += f", {c.timing.speedup_vs_compiled:.2f}× vs torch.compile"
            parts.append(text)
        if m.model:
            parts.append(f"whole model: {m.model.status}")
    parts += step_errors(result)  # each error with its reason: the log is where the toast sends the user
    return f"fuselens ({where}): " + "; ".join(parts) if parts else "fuselens: nothing to validate"


def _view(services: Services, path: str, kind: str, name: str, text: str) -> str:
    """`text` as the read-only view `name` of `kind` for the document at `path` (`views.py`)."""
    folders = services.state.folders
    workspace = folders.root_of(path) or (folders.roots[0] if folders.roots else os.path.dirname(path))
    try:
        return views.write_view(views.views_folder(workspace, kind), name, text)
    except (views.ViewRefused, OSError) as exc:
        raise JsonRpcInvalidParams.of(ValueError(f"the view was not written: {exc}")) from None


async def _show_kernel(services: Services, snapshot: Snapshot, which: str | None) -> dict[str, Any]:
    """A cluster's kernel and its launcher (`which`: a cluster or kernel name), or a model's or the
    file's whole kernel module, as a read-only view the client is asked to show."""
    path = _document_path(snapshot.uri)
    report = await report_with_code(snapshot.uri, path, _analysis_for(snapshot), services)
    chosen = [
        c for m in report.models for c in m.clusters if c.kernel and (which in (None, m.name, c.id, c.kernel.name))
    ]
    if which and not chosen:
        raise JsonRpcInvalidParams.of(ValueError(f"no model or cluster {which!r} in {os.path.basename(path)}"))
    single = len(chosen) == 1 and which in (chosen[0].id, chosen[0].kernel.name if chosen[0].kernel else None)
    stem = os.path.splitext(os.path.basename(path))[0]
    if single and chosen[0].kernel:
        kernel = chosen[0].kernel
        text = _kernel_view(stem, chosen[0].id, kernel.name, kernel.source)
        name = f"{stem}_{kernel.name}.py"
    else:
        text = kernel_module_text(report)
        name = os.path.basename(chosen[0].kernel.path) if chosen and chosen[0].kernel else f"{stem}_kernels.py"
    target = _view(services, path, "kernels", name, text)
    line = 0
    if chosen and chosen[0].kernel:
        marker = f"def {chosen[0].kernel.name}("
        line = next((i for i, code in enumerate(text.splitlines()) if code.startswith(marker)), 0)
    at = lsp.Range(lsp.Position(line, 0), lsp.Position(line, 0))
    await services.editor.show_document(
        snapshot.client, lsp.ShowDocumentParams(path_to_uri(target), take_focus=True, selection=at)
    )
    return {"path": target, "kernels": [c.kernel.name for c in chosen if c.kernel], "text": text}


def _kernel_view(stem: str, cluster: str, kernel: str, source: str) -> str:
    """One cluster's part of the kernel module: what to read, not to run (the module's helpers are not in it)."""
    return (
        f"# {cluster} of {stem}.py: `{kernel}`, its Triton kernel(s), launcher and reference, as\n"
        f"# `fuselens apply` writes them into {stem}_kernels.py (a read-only view; the module's shared\n"
        "# helpers, such as _div and _row_tile, are in the module).\n\n" + source.strip("\n") + "\n"
    )


async def _show_inductor(services: Services, snapshot: Snapshot, cluster: str) -> dict[str, Any]:
    """Inductor's Triton for the kernels that compute `cluster`, in a file beside ours."""
    path = _document_path(snapshot.uri)
    analysis = _analysis_for(snapshot)
    found = [(m, c) for m in analysis.report.models if m.inductor for c in m.inductor.clusters if c.cluster == cluster]
    if not found or analysis.inductor_sources is None:
        raise JsonRpcInvalidParams.of(ValueError(f"no torch.compile comparison for {cluster} yet"))
    _, comparison = found[0]
    ids = list(dict.fromkeys(k.kernel for i in comparison.instances for k in i.kernels))
    text = f"# torch.compile's kernels for {cluster} of {os.path.basename(path)}: {comparison.status}\n"
    text += f"# {comparison.summary}\n\n"
    text += "\n\n".join(analysis.inductor_sources.get(i, f"# {i}: no source") for i in ids) + "\n"
    target = _view(services, path, "inductor", f"{os.path.splitext(os.path.basename(path))[0]}_{cluster}.py", text)
    await services.editor.show_document(snapshot.client, lsp.ShowDocumentParams(path_to_uri(target), take_focus=True))
    return {"path": target, "kernels": ids, "status": comparison.status, "text": text}


async def _write_module(services: Services, snapshot: Snapshot, version: int, ids: list) -> dict[str, Any]:
    """Write the kernel module of the quick fix for `ids` on disk (the fix's edit holds only the model's
    lines: an editor would leave a module it edits unsaved), its code generated first if it was not."""
    path = _document_path(snapshot.uri)
    analysis = snapshot.latest  # not snapshot.analysis: the edit this command follows changed the document
    if analysis is None or analysis.failure is not None or analysis.version != version:
        raise JsonRpcInvalidParams.of(ValueError(f"the document changed since version {version}; nothing written"))
    report = await report_with_code(snapshot.uri, path, analysis, services)  # (for this version, whatever comes)
    kernels = [c.kernel for _, c in report.clusters() if c.id in ids and c.kernel]
    rewritten = [r.id for _, _, r in report.rewrites() if r.id in ids]
    if not kernels and not rewritten:
        raise JsonRpcInvalidParams.of(ValueError(f"no kernels for clusters {ids}"))
    target = kernels[0].path if kernels else edits_mod.kernel_module_path(path)
    records = rewrites_mod.records(analysis.text, report, rewritten)
    if os.path.dirname(os.path.realpath(target)) != os.path.dirname(os.path.realpath(path)):
        raise JsonRpcInvalidParams.of(ValueError("the kernel module must sit beside the model file"))
    if services.state.folders.root_of(path) is None:
        raise JsonRpcInvalidParams.of(ValueError(f"{os.path.basename(path)} is outside the workspace; nothing written"))
    # Under the model's lock, as `fuselens apply` writes (a model not saved yet has none): the module either
    # of them wrote is merged into the other's, never written over.
    lock = files.locked(path, wait_s=MODULE_LOCK_WAIT_S) if os.path.exists(path) else contextlib.nullcontext()
    try:
        with lock:
            files.check_kernel_module(target)
            files.replace_text(target, kernel_module_text(report, [str(i) for i in ids], records))
    except files.Refused as exc:
        raise JsonRpcInvalidParams.of(ValueError(str(exc))) from None
    services.log.line(f"wrote {os.path.basename(target)} for {', '.join(map(str, ids))}")
    services.analyzer.file_changed(target)  # the models that import it are analyzed again, with the kernels now on disk
    return {"path": target}
