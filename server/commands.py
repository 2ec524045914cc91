"""Workspace commands: analyze now, validate kernels (with progress), profile the forward, show and
write kernels (their code generated first where the analysis left it out: `generation.py`).

Validation runs in the worker, like analysis.  On a machine without CUDA it says so and
offers the Triton interpreter instead (numerics only); a configured remote runner (a
command line with `{file}`, and optionally `{json}` for its result file) takes the job
to a GPU elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from typing import TYPE_CHECKING, Any

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.codegen import rewrites as rewrites_mod
from fuselens.contracts import commands as command_ids
from fuselens.contracts.options import ProfileOptions, ValidateOptions
from fuselens.contracts.plain import to_plain
from fuselens.contracts.profile import Profile
from fuselens.contracts.profile_view import profile_view
from fuselens.contracts.report import Report
from fuselens.contracts.results_view import results_view, view_markdown
from fuselens.contracts.validation import ValidationReport, step_errors
from fuselens.worker.protocol import Limits, ProfileJob, ValidateJob

from . import history, views
from .features.measured import time_label, where_measured
from .features.text import path_to_uri, uri_to_path
from .generation import NotTheSameAnalysis, has_code
from .runner import RemoteFailed
from .scheduler import Analysis
from .workers import JobFailed

if TYPE_CHECKING:
    from .app import FuselensServer

INTERPRET = "Check numerics in the Triton interpreter"
ALWAYS_INTERPRET = "Always check in the interpreter"  # (for the rest of the session)

SHOW_DOCUMENT_TIMEOUT_S = 10.0  # how long a command waits for the client to show a view
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


def _document_path(ls: FuselensServer, uri: str) -> str:
    path = uri_to_path(uri)
    if path is None or not path.endswith(".py"):
        raise JsonRpcInvalidParams.of(ValueError(f"not a Python file URI: {uri!r}"))
    return path


def _open_document_path(ls: FuselensServer, uri: str) -> str:
    """The path of the open document `uri`: a command that runs its model asks about no other."""
    path = _document_path(ls, uri)
    if ls.document(uri) is None:
        raise JsonRpcInvalidParams.of(ValueError(f"{uri} is not open"))
    return path


def register_commands(server: FuselensServer) -> None:
    @server.command(command_ids.ANALYZE)
    async def analyze(ls, *args):
        (uri,) = _args(args, [("uri", str, True)])
        path = _open_document_path(ls, uri)
        if not ls.trusted(path):
            return {"scheduled": False, "reason": "untrusted", "message": ls.untrusted(path)}
        ls.schedule(uri)
        return {"scheduled": True}

    @server.command(command_ids.VALIDATE_KERNEL)
    async def validate_kernel(ls, *args):
        uri, cluster, options = _args(args, [("uri", str, True), ("cluster", str, True), ("options", dict, False)])
        return await _validate(ls, uri, [cluster], None, options or {})

    @server.command(command_ids.VALIDATE_ALL)
    async def validate_all(ls, *args):
        uri, model, options = _args(args, [("uri", str, True), ("model", str, False), ("options", dict, False)])
        return await _validate(ls, uri, None, model, options or {})

    @server.command(command_ids.PROFILE)
    async def profile(ls, *args):
        uri, model = _args(args, [("uri", str, True), ("model", str, False)])
        return await _profile(ls, uri, model)

    @server.command(command_ids.VALIDATION_RESULTS)
    async def validation_results(ls, *args):
        (uri,) = _args(args, [("uri", str, True)])
        return _last_results(ls, _document_path(ls, uri))

    @server.command(command_ids.SHOW_KERNEL)
    async def show_kernel(ls, *args):
        uri, which = _args(args, [("uri", str, True), ("which", str, False)])
        return await _show_kernel(ls, uri, which)

    @server.command(command_ids.SHOW_INDUCTOR_KERNEL)
    async def show_inductor_kernel(ls, *args):
        uri, cluster = _args(args, [("uri", str, True), ("cluster", str, True)])
        return await _show_inductor(ls, uri, cluster)

    @server.command(command_ids.WRITE_KERNEL_MODULE)
    async def write_module(ls, *args):
        uri, version, ids = _args(args, [("uri", str, True), ("version", int, True), ("clusters", list, True)])
        return await _write_module(ls, uri, version, ids)


def _analysis_for(ls: FuselensServer, uri: str):
    analysis = ls.current(uri)
    if analysis is None:
        raise JsonRpcInvalidParams.of(ValueError(f"no analysis of {uri} yet: open or save it first"))
    return analysis


async def _validate(
    ls: FuselensServer, uri: str, clusters: list[str] | None, model: str | None, options: dict[str, Any]
) -> dict[str, Any]:
    path = _open_document_path(ls, uri)
    if not ls.trusted(path):
        return {"error": "untrusted", "message": ls.untrusted(path)}
    analysis = _analysis_for(ls, uri)
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
    interpret = bool(options.get("interpret")) or ls.no_gpu_choice == ALWAYS_INTERPRET
    what = ", ".join(clusters) if clusters and len(clusters) <= 3 else "kernels"
    name = os.path.basename(path)
    ls.log_line(f"validating {what} of {name}{' in the Triton interpreter' if interpret else ''}")
    try:
        result = await _with_progress(
            ls, f"fuselens: validating {what}", _validation(ls, path, analysis.text, clusters, interpret)
        )
        if not interpret and result.needs_gpu:
            if ls.settings.remote_runner:
                ls.log_line(f"no CUDA GPU here: validating {name} with the remote runner")
                result = await _with_progress(
                    ls, f"fuselens: validating {what} on the remote runner", _remote(ls, path)
                )
            elif await _interpret_instead(ls):
                result = await _with_progress(
                    ls,
                    f"fuselens: validating {what} in the interpreter",
                    _validation(ls, path, analysis.text, clusters, True),
                )
    except (JobFailed, RemoteFailed) as exc:
        ls.log_line(f"validation of {what} of {name} did not run: {exc}")
        ls.tell(f"fuselens: validation did not run: {exc}", lsp.MessageType.Warning)
        return {"error": exc.kind, "message": str(exc)}
    ls.log_line(f"validation of {name}: {_summary(result)}")
    ls.tell(_toast(result), lsp.MessageType.Info if result.ok else lsp.MessageType.Warning)
    return {**result.to_dict(), **_results(ls, path, result)}


async def _profile(ls: FuselensServer, uri: str, model: str | None) -> dict[str, Any]:
    """Run the file's forwards under the profiler in the worker (on CUDA where the worker has it, else
    on the CPU) and keep the profile for the hover, the inlay hints and the lenses."""
    path = _open_document_path(ls, uri)
    if not ls.trusted(path):
        return {"error": "untrusted", "message": ls.untrusted(path)}
    analysis = _analysis_for(ls, uri)
    options = ls.settings.analyze_options(analysis.text)
    if model is not None:
        options.model_class = model
    name = os.path.basename(path)
    what = model or name
    ls.log_line(f"profiling {model or 'the models'} of {name}")
    w = ls.settings.worker
    remote = ls.settings.remote_profiler
    # With a remote profiler, the worker profiles only on a GPU of its own: a CPU profile here is
    # not what the user set one up for.
    profile_options = ProfileOptions(device="cuda" if remote else "")
    progress = await _Progress.start(ls, f"fuselens: profiling {what}")
    try:
        async with ls.scheduler.admission.turn():
            report: Report = await ls.get_worker().run(
                ProfileJob(path, options, profile_options),
                Limits(w.validate_timeout_seconds, w.memory_mb),
                on_progress=lambda message, fraction: progress.report(message, fraction),
            )
        if remote and report.profile is not None and report.profile.problems:
            ls.log_line(f"no CUDA GPU here: profiling {name} with the remote profiler")
            report = await ls.remote.profile(remote, path, w.validate_timeout_seconds, progress.report)
    except (JobFailed, RemoteFailed) as exc:
        message = _profile_failure(ls, what, exc)
        ls.log_line(message)
        ls.tell(f"fuselens: {message}", lsp.MessageType.Error)
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
        ls.log_line(f"profile of {name} did not run: {message}")
        ls.tell(f"fuselens: profiling {what} did not run: {message}", lsp.MessageType.Error)
        return {"error": "problem", "message": message}
    profile = report.profile
    ls.profiles[path] = (report.source_sha256, profile)
    ls.refresh_views()
    summary = _profile_summary(profile)
    ls.log_line(f"profile of {name}: {summary}")
    unprofiled = [m for m in profile.models if m.problem]
    if unprofiled:
        # Said as a failure, with what to do about it: a model a CPU does not profile wants a GPU.
        hint = "" if remote else f" {NO_GPU_PROFILE_HINT}" if profile.mode == "cpu" else ""
        everything = len(unprofiled) == len(profile.models)
        ls.tell(
            f"fuselens: {summary.rstrip('.')}.{hint}", lsp.MessageType.Error if everything else lsp.MessageType.Warning
        )
    else:
        ls.tell(f"fuselens: {summary}", lsp.MessageType.Info)
    analyzed = {m.name: [i.shape or [] for i in m.inputs] for m in report.models}
    view = profile_view(path, profile, report.libraries, analyzed)
    return {
        "profile": to_plain(profile),
        "results_view": to_plain(view),
        "results_markdown": view_markdown(view),
    }


NO_GPU_PROFILE_HINT = "Set fuselens.remoteProfiler to profile it on a GPU machine."


def _profile_failure(ls: FuselensServer, what: str, exc: JobFailed | RemoteFailed) -> str:
    """Why the profile of `what` did not run, in the words of profiling and of the settings that bound it
    (the worker's own message speaks of an analysis, the job it runs most)."""
    w = ls.settings.worker
    hint = "Raise that limit" if ls.settings.remote_profiler else f"{NO_GPU_PROFILE_HINT[:-1]}, or raise that limit"
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


def _results(ls: FuselensServer, path: str, result: ValidationReport) -> dict[str, Any]:
    """The results view of `result` beside the file's earlier runs, as data (VS Code's webview) and as
    markdown (Neovim's :FuselensResults); a run that checked something is added to the history first."""
    latest, earlier = history.record(path, result, ls.log_line)
    view = results_view(latest, earlier)
    return {"results_view": to_plain(view), "results_markdown": view_markdown(view)}


def _last_results(ls: FuselensServer, path: str) -> dict[str, Any]:
    """The results view of the last validation of `path` kept in its history, beside the runs before it."""
    runs = history.load(path, ls.log_line)
    if not runs:
        return {"results_view": None, "message": f"no validation of {os.path.basename(path)} yet"}
    view = results_view(runs[-1], runs[:-1])
    return {"results_view": to_plain(view), "results_markdown": view_markdown(view)}


def _validation(ls: FuselensServer, path: str, text: str, clusters: list[str] | None, interpret: bool):
    return lambda progress: _run_validation(ls, path, text, clusters, interpret, progress)


def _remote(ls: FuselensServer, path: str):
    runner, seconds = ls.settings.remote_runner or "", ls.settings.worker.validate_timeout_seconds
    return lambda progress: ls.remote.validate(runner, path, seconds, progress.report)


async def _with_progress(ls: FuselensServer, title: str, work) -> ValidationReport:
    """`work(progress)` under a work-done progress that lasts exactly as long as it runs."""
    progress = await _Progress.start(ls, title)
    try:
        result: ValidationReport = await work(progress)
    finally:
        progress.end()
    return result


async def _interpret_instead(ls: FuselensServer) -> bool:
    """Whether to check numerics in the interpreter, there being no GPU and no remote runner: asked
    once; "always" is kept for the rest of the session."""
    choice = await _ask(
        ls,
        "No CUDA GPU on this machine, so the kernels cannot be timed here. Check their numerics in the "
        "Triton interpreter, or set fuselens.remoteRunner to validate on a GPU machine.",
        [INTERPRET, ALWAYS_INTERPRET],
    )
    if choice == ALWAYS_INTERPRET:
        ls.no_gpu_choice = ALWAYS_INTERPRET
        ls.log_line("no CUDA GPU: validations check numerics in the Triton interpreter from now on")
    return choice in (INTERPRET, ALWAYS_INTERPRET)


async def _run_validation(
    ls: FuselensServer, path: str, text: str, clusters: list[str] | None, interpret: bool, progress: _Progress
) -> ValidationReport:
    w = ls.settings.worker
    job = ValidateJob(path, ls.settings.analyze_options(text), ValidateOptions(interpret=interpret, clusters=clusters))
    async with ls.scheduler.admission.turn():
        result: ValidationReport = await ls.get_worker().run(
            job,
            Limits(w.validate_timeout_seconds, w.memory_mb),
            on_progress=lambda message, fraction: progress.report(message, fraction),
        )
    return result


async def _ask(ls: FuselensServer, message: str, options: list[str]) -> str | None:
    window = ls.client_capabilities.window
    if not (window and window.show_message):
        return None
    try:
        async with asyncio.timeout(600):
            answer = await ls.window_show_message_request_async(
                lsp.ShowMessageRequestParams(lsp.MessageType.Info, message, [lsp.MessageActionItem(o) for o in options])
            )
    except Exception:  # no answer is "no"
        return None
    return answer.title if answer else None


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


class _Progress:
    """Work-done progress when the client supports it; silent otherwise."""

    def __init__(self, ls, token: str | None):
        self.ls = ls
        self.token = token

    @classmethod
    async def start(cls, ls: FuselensServer, title: str) -> _Progress:
        window = ls.client_capabilities.window
        if not (window and window.work_done_progress):
            return cls(ls, None)
        token = f"fuselens-{uuid.uuid4().hex[:8]}"
        try:
            async with asyncio.timeout(10):
                await ls.work_done_progress.create_async(token)
        except Exception:
            return cls(ls, None)
        ls.work_done_progress.begin(token, lsp.WorkDoneProgressBegin(title=title, cancellable=False, percentage=0))
        return cls(ls, token)

    def report(self, message: str, fraction: float | None = None) -> None:
        if self.token:
            percentage = int(fraction * 100) if fraction is not None else None
            self.ls.work_done_progress.report(
                self.token, lsp.WorkDoneProgressReport(message=message, percentage=percentage)
            )

    def end(self) -> None:
        if self.token:
            self.ls.work_done_progress.end(self.token, lsp.WorkDoneProgressEnd(message="done"))
            self.ls.work_done_progress.tokens.pop(self.token, None)  # (pygls keeps every token it was given)


def _view(ls: FuselensServer, path: str, kind: str, name: str, text: str) -> str:
    """`text` as the read-only view `name` of `kind` for the document at `path` (`views.py`)."""
    workspace = ls.workspace_root(path) or (ls.roots[0] if ls.roots else os.path.dirname(path))
    try:
        return views.write_view(views.views_folder(workspace, kind), name, text)
    except (views.ViewRefused, OSError) as exc:
        raise JsonRpcInvalidParams.of(ValueError(f"the view was not written: {exc}")) from None


async def _show_document(ls: FuselensServer, params: lsp.ShowDocumentParams) -> None:
    """Ask the client to show a view; a client that never answers does not hold the command up."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(SHOW_DOCUMENT_TIMEOUT_S):
            await ls.window_show_document_async(params)


async def _show_kernel(ls: FuselensServer, uri: str, which: str | None) -> dict[str, Any]:
    """A cluster's kernel and its launcher (`which`: a cluster or kernel name), or a model's or the
    file's whole kernel module, as a read-only view the client is asked to show."""
    from .app import kernel_module_text

    path = _document_path(ls, uri)
    report = await with_code(ls, uri, path, _analysis_for(ls, uri))
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
    target = _view(ls, path, "kernels", name, text)
    window = ls.client_capabilities.window
    if window and window.show_document and window.show_document.support:
        line = 0
        if chosen and chosen[0].kernel:
            marker = f"def {chosen[0].kernel.name}("
            line = next((i for i, code in enumerate(text.splitlines()) if code.startswith(marker)), 0)
        await _show_document(
            ls,
            lsp.ShowDocumentParams(
                path_to_uri(target), take_focus=True, selection=lsp.Range(lsp.Position(line, 0), lsp.Position(line, 0))
            ),
        )
    return {"path": target, "kernels": [c.kernel.name for c in chosen if c.kernel], "text": text}


def _kernel_view(stem: str, cluster: str, kernel: str, source: str) -> str:
    """One cluster's part of the kernel module: what to read, not to run (the module's helpers are not in it)."""
    return (
        f"# {cluster} of {stem}.py: `{kernel}`, its Triton kernel(s), launcher and reference, as\n"
        f"# `fuselens apply` writes them into {stem}_kernels.py (a read-only view; the module's shared\n"
        "# helpers, such as _div and _row_tile, are in the module).\n\n" + source.strip("\n") + "\n"
    )


async def _show_inductor(ls: FuselensServer, uri: str, cluster: str) -> dict[str, Any]:
    """Inductor's Triton for the kernels that compute `cluster`, in a file beside ours."""
    path = _document_path(ls, uri)
    analysis = _analysis_for(ls, uri)
    found = [(m, c) for m in analysis.report.models if m.inductor for c in m.inductor.clusters if c.cluster == cluster]
    if not found or analysis.inductor_sources is None:
        raise JsonRpcInvalidParams.of(ValueError(f"no torch.compile comparison for {cluster} yet"))
    _, comparison = found[0]
    ids = list(dict.fromkeys(k.kernel for i in comparison.instances for k in i.kernels))
    text = f"# torch.compile's kernels for {cluster} of {os.path.basename(path)}: {comparison.status}\n"
    text += f"# {comparison.summary}\n\n"
    text += "\n\n".join(analysis.inductor_sources.get(i, f"# {i}: no source") for i in ids) + "\n"
    target = _view(ls, path, "inductor", f"{os.path.splitext(os.path.basename(path))[0]}_{cluster}.py", text)
    window = ls.client_capabilities.window
    if window and window.show_document and window.show_document.support:
        await _show_document(ls, lsp.ShowDocumentParams(path_to_uri(target), take_focus=True))
    return {"path": target, "kernels": ids, "status": comparison.status, "text": text}


async def with_code(ls: FuselensServer, uri: str, path: str, analysis: Analysis) -> Report:
    """The analysis's report with its kernels' code (`generation.py`); an error the client is told when
    it cannot be generated (generating runs the model's code: only where it may run)."""
    if not ls.trusted(path) and not has_code(ls.generation.joined(uri, analysis).report):
        raise JsonRpcInvalidParams.of(ValueError(ls.untrusted(path)))
    try:
        return await ls.generation.with_code(uri, path, analysis)
    except (JobFailed, NotTheSameAnalysis) as exc:
        ls.log_line(f"the kernels of {os.path.basename(path)} were not generated: {exc}")
        raise JsonRpcInvalidParams.of(ValueError(f"the kernels were not generated: {exc}")) from None


async def _write_module(ls: FuselensServer, uri: str, version: int, ids: list) -> dict[str, Any]:
    """Write the kernel module of the quick fix for `ids` on disk (the fix's edit holds only the model's
    lines: an editor would leave a module it edits unsaved), its code generated first if it was not."""
    from .app import kernel_module_text

    path = _document_path(ls, uri)
    analysis = ls.scheduler.cache.get(uri)  # not ls.current(): the edit this command follows changed the document
    if analysis is None or analysis.failure is not None or analysis.version != version:
        raise JsonRpcInvalidParams.of(ValueError(f"the document changed since version {version}; nothing written"))
    report = await with_code(ls, uri, path, analysis)  # (for this version, whatever the user does meanwhile)
    kernels = [c.kernel for _, c in report.clusters() if c.id in ids and c.kernel]
    rewritten = [r.id for _, _, r in report.rewrites() if r.id in ids]
    if not kernels and not rewritten:
        raise JsonRpcInvalidParams.of(ValueError(f"no kernels for clusters {ids}"))
    target = kernels[0].path if kernels else edits_mod.kernel_module_path(path)
    records = rewrites_mod.records(analysis.text, report, rewritten)
    if os.path.dirname(os.path.realpath(target)) != os.path.dirname(os.path.realpath(path)):
        raise JsonRpcInvalidParams.of(ValueError("the kernel module must sit beside the model file"))
    if ls.workspace_root(path) is None:
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
    ls.log_line(f"wrote {os.path.basename(target)} for {', '.join(map(str, ids))}")
    ls.file_changed(target)  # the models that import it are analyzed again, with the kernels now on disk
    return {"path": target}
