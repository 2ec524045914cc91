"""The patched model as a whole, against the model as written.

Every cluster that applies is applied to a copy of the file, as `fuselens apply` would: the edits of
the file's own lines, the source rewrites of its patterns, and the library patches `install()` puts
in place.  The copy's model, with the
original's weights, must compute what the original computes

- in eval mode, at the inputs validated at, with its kernels running (each launch counted);
- in training mode: the outputs, every parameter's gradient, and the running statistics a step
  leaves (the dropouts drop nothing in both runs, so that their random masks, which a kernel's
  output layout may draw differently, do not hide or fake a difference);
- in eval mode at inputs of other sizes (another batch, another sequence length), where the kernels
  meet the ranks and shapes they were not analyzed at, and must fit or leave the lines to run.

The original's results are computed before the copy is imported: a library patch changes the library's
functions for every model of the process, until `uninstall()`, which follows every check.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

try:
    import numpy
except ImportError:  # torch runs without it
    numpy = None  # type: ignore[assignment]

from fuselens.analysis import capture, loader
from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.codegen.module import module_for_report
from fuselens.contracts.config import InputSpec
from fuselens.contracts.report import Report
from fuselens.contracts.validation import ModelCheck

from .numerics import NARROW, TF32, as_accurate_as_eager, compare, sums_close


@dataclass
class Original:
    """What the model as written computes: eval outputs at each set of inputs, and one training step."""

    eval_outputs: list[Any] = field(default_factory=list)
    train_outputs: Any = None
    gradients: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    train_problem: str = ""


def other_sizes(specs: list[InputSpec]) -> list[InputSpec]:
    """The same inputs at other sizes: one more in the batch, and, for a sequence (token ids, or a
    [batch, sequence, width] tensor first), one fewer position; an image keeps its channels and size.
    A size changes in every input that has it in that place, so that inputs that agree still do."""
    if not specs or not specs[0].shape:
        return specs
    first = specs[0]
    batch = first.shape[0]
    sequence = None
    if len(first.shape) == 3 or (len(first.shape) == 2 and first.dtype in ("int64", "int32")):
        sequence = first.shape[1] if first.shape[1] > 2 else None
    out = []
    for spec in specs:
        shape = list(spec.shape)
        if shape and shape[0] == batch:
            shape[0] += 1
        if sequence is not None and len(shape) >= 2 and shape[1] == sequence:
            shape[1] -= 1
        out.append(InputSpec(shape, spec.dtype, high=spec.high))
    return out


def check_patched_model(
    report: Report,
    text: str,
    applied: list[str],
    build: Callable[[ModuleType | None], torch.nn.Module],
    inputs: list[list[torch.Tensor]],
    precision: torch.dtype | None,
    device: str,
    tmp: str,
    then: Callable[[torch.nn.Module, torch.nn.Module, ModelCheck], None] | None = None,
) -> ModelCheck:
    """Apply `applied` (edits and library patches) to a copy of `text` in `tmp`, and compare its model
    (`build(module)`: `build(None)` is the original) with the original, at each set of `inputs` (the
    first is the one validated at); `then(original, patched, check)` runs before the patches are undone
    (to time them)."""
    original_model = build(None).to(device)
    try:
        original = _run_original(original_model, inputs)
    except Exception as exc:  # the model as written does not run here (a dtype the meta trace let through)
        return ModelCheck("error", applied, message=f"the model as written fails: {type(exc).__name__}: {exc}")
    path = os.path.join(tmp, os.path.basename(report.file))
    module_path = os.path.join(tmp, os.path.basename(edits_mod.kernel_module_path(report.file)))
    patched_text = edits_mod.apply_line_edits(text, edits_mod.fix_edits(text, report, applied))
    # A file applied before imports kernels from the module beside it: the copy's module keeps them, as
    # `apply` merging into it would.
    try:
        existing = files.check_kernel_module(edits_mod.kernel_module_path(report.file))
    except (files.Refused, OSError) as exc:
        return ModelCheck("error", applied, message=f"the kernel module beside the file cannot be read: {exc}")
    with open(module_path, "w", encoding="utf-8") as fh:
        fh.write(module_for_report(report, existing, applied))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(patched_text)
    stem = os.path.splitext(os.path.basename(module_path))[0]
    sys.modules.pop(stem, None)  # the patched file must import the module just written
    sys.path.insert(0, tmp)
    try:
        # The text, not the file: the copy is UTF-8, and its coding cookie may name another encoding.
        patched_module = loader.import_file(path, capture.UserCode(), patched_text)
    except loader.LoadError as exc:
        return ModelCheck("error", applied, message=f"the patched file does not import: {exc}")
    finally:
        if tmp in sys.path:
            sys.path.remove(tmp)
    kernels = sys.modules.get(stem)
    try:
        fused = build(patched_module).to(device)
        fused.load_state_dict(original_model.state_dict())
        result = _compare(original, original_model, fused, kernels, inputs, precision, applied, device)
        if then is not None:
            then(original_model, fused, result)
        return result
    except Exception as exc:
        return ModelCheck("error", applied, message=f"the patched model failed: {type(exc).__name__}: {exc}")
    finally:
        uninstall = getattr(kernels, "uninstall", None)
        if callable(uninstall):
            uninstall()


def _run_original(model: torch.nn.Module, inputs: list[list[torch.Tensor]]) -> Original:
    original = Original()
    model.eval()
    with torch.no_grad():
        original.eval_outputs = [model(*inputs[0])]
        for xs in inputs[1:]:
            try:
                original.eval_outputs.append(model(*xs))
            except Exception:  # sizes the model as written does not take: the patched one is not asked them
                break
    if _crashes_cpu_group_norm_backward(model, inputs[0]):
        original.train_problem = (
            "torch's CPU GroupNorm backward crashes the process on an input that is not contiguous (a "
            "channels-last view); the training step is checked on a GPU"
        )
        return original
    trained = copy.deepcopy(model)
    try:
        original.train_outputs, original.gradients, original.buffers = _training_step(trained, inputs[0])
    except Exception as exc:  # a model that cannot train (its own code refuses), or runs out of memory
        original.train_problem = f"{type(exc).__name__}: {exc}"
    return original


def _crashes_cpu_group_norm_backward(model: torch.nn.Module, inputs: list[torch.Tensor]) -> bool:
    """Whether the forward gives a group norm a non-contiguous CPU tensor, whose backward in torch
    (2.13's CPU kernel) ends the process with a segmentation fault rather than an error."""
    functional = torch.nn.functional
    own = functional.group_norm
    found = []

    def watched(input, *args, **kwargs):
        if input.device.type == "cpu" and not input.is_contiguous():
            found.append(True)
        return own(input, *args, **kwargs)

    functional.group_norm = watched
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception:
        return False
    finally:
        functional.group_norm = own
    return bool(found)


def _compare(
    original: Original,
    original_model: torch.nn.Module,
    fused: torch.nn.Module,
    kernels: ModuleType | None,
    inputs: list[list[torch.Tensor]],
    precision: torch.dtype | None,
    applied: list[str],
    device: str,
) -> ModelCheck:
    fused.eval()
    with _launches(kernels) as launches, torch.no_grad():
        got = fused(*inputs[0])
    result = _outputs_check(got, original.eval_outputs[0], precision, applied, device)
    if result.status == "mismatch" and precision in NARROW:
        result = _against_float64(original_model, inputs[0], got, original.eval_outputs[0], result)
    result.kernel_launches = sum(launches.values())
    if len(original.eval_outputs) > 1:
        with torch.no_grad():
            others = [(fused(*xs), want) for xs, want in zip(inputs[1:], original.eval_outputs[1:], strict=False)]
        checks = []
        for xs, (g, w) in zip(inputs[1:], others, strict=False):
            check_ = _outputs_check(g, w, precision, applied, device)
            if check_.status == "mismatch" and precision in NARROW:
                check_ = _against_float64(original_model, xs, g, w, check_)
            checks.append(check_)
        worst = max(checks, key=lambda c: (c.status != "matches", c.max_abs or 0.0))
        shapes = ", ".join(f"{list(x.shape)}" for xs in inputs[1:] for x in xs)
        error = f", max |err| {worst.max_abs:.3g}" if worst.max_abs is not None else ""
        worst.message = f"at {shapes}{error}" + (f"; {worst.message}" if worst.message else "")
        result.other_shapes = worst
    result.training = _training_check(original, original_model, fused, inputs[0], precision, applied, device)
    if result.status == "matches":
        for extra in (result.other_shapes, result.training):
            if extra is not None and extra.status != "matches":
                result.status = extra.status if extra.status in ("mismatch", "error") else result.status
    return result


def _training_check(
    original: Original,
    original_model: torch.nn.Module,
    fused: torch.nn.Module,
    inputs: list[torch.Tensor],
    precision: torch.dtype | None,
    applied: list[str],
    device: str,
) -> ModelCheck:
    if original.train_problem:
        return ModelCheck("skipped", applied, message=f"the model does not train as written: {original.train_problem}")
    outputs, gradients, buffers = _training_step(fused, inputs)
    missing = [name for name in original.gradients if name not in gradients]
    if missing:
        return ModelCheck("mismatch", applied, message=f"{missing[0]} got no gradient, where the original's has one")
    pairs = [("outputs", outputs, original.train_outputs)]
    pairs += [(f"{name}'s gradient", gradients[name], want) for name, want in original.gradients.items()]
    pairs += [(name, buffers[name], want) for name, want in original.buffers.items()]
    checked = [(name, _outputs_check(got, want, precision, applied, device)) for name, got, want in pairs]
    if any(c.status == "mismatch" for _, c in checked):  # sums over a batch (a gradient) round more than an element
        checked = _judged_by_accuracy(original_model, inputs, pairs, checked)
    name, bad = max(checked, key=lambda c: (c[1].status != "matches", c[1].max_abs or 0.0))
    what = f"{len(original.gradients)} gradient(s), {len(original.buffers)} floating buffer(s)"
    worst = f"{name}, max |err| {bad.max_abs:.3g}" if bad.max_abs is not None else name
    message = f"one step (outputs, {what}; dropouts dropping nothing), worst: {worst}"
    return ModelCheck(
        bad.status, applied, bad.max_abs, bad.max_rel, f"{message}; {bad.message}" if bad.message else message
    )


def _judged_by_accuracy(
    original_model: torch.nn.Module,
    inputs: list[torch.Tensor],
    pairs: list[tuple[str, Any, Any]],
    checked: list[tuple[str, ModelCheck]],
) -> list[tuple[str, ModelCheck]]:
    """The training step's mismatches judged again by accuracy: each value (output, gradient, statistic)
    "matches" when it is as close to the same step in float64 as eager's is (a gradient sums over the
    batch, in another order in a kernel than in eager, and in bf16 each layer rounds), or, a gradient
    or statistic, when it is eager's up to the order of its sums."""
    try:
        wide = copy.deepcopy(original_model).to(torch.float64)
        exact_inputs = [t.to(torch.float64) if t.is_floating_point() else t for t in inputs]
        outputs, gradients, buffers = _training_step(wide, exact_inputs)
    except (RuntimeError, TypeError, ValueError):  # an op with no float64 kernel (a grouped GEMM)
        return _judged_by_norm(pairs, checked)
    exact = {"outputs": outputs} | {f"{n}'s gradient": g for n, g in gradients.items()} | buffers
    judged = []
    for (name, got, want), (_, check_) in zip(pairs, checked, strict=True):
        if check_.status != "mismatch" or name not in exact:
            judged.append((name, check_))
            continue
        accuracies = [
            as_accurate_as_eager(g.detach().double(), w.detach().double(), e.detach())
            for g, w, e in zip(
                capture.tensors_in(got), capture.tensors_in(want), capture.tensors_in(exact[name]), strict=False
            )
        ]
        if accuracies and all(a.ok for a in accuracies):
            worst = max(accuracies, key=lambda a: a.error)
            message = (
                f"as accurate as eager against float64 (RMS error {worst.error:.3g}, eager's {worst.eager_error:.3g})"
            )
            check_ = ModelCheck("matches", check_.applied, check_.max_abs, check_.max_rel, message)
        judged.append((name, check_))
    return _judged_by_norm(pairs, judged)


def _judged_by_norm(
    pairs: list[tuple[str, Any, Any]], checked: list[tuple[str, ModelCheck]]
) -> list[tuple[str, ModelCheck]]:
    """A gradient's or statistic's mismatch judged again as a sum: it "matches" when its difference is
    small against its own size (`numerics.sums_close`)."""
    judged = []
    for (name, got, want), (_, check_) in zip(pairs, checked, strict=True):
        if check_.status == "mismatch" and name != "outputs" and isinstance(got, torch.Tensor):
            close = sums_close(got, want)
            if close.ok:
                message = f"relative 2-norm difference {close.relative:.3g}, within {close.bound:g}"
                check_ = ModelCheck("matches", check_.applied, check_.max_abs, check_.max_rel, message)
        judged.append((name, check_))
    return judged


def _training_step(
    model: torch.nn.Module, inputs: list[torch.Tensor]
) -> tuple[Any, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One step of training mode: the outputs, each parameter's gradient of a loss over every output
    (the sum of their squares, scaled), and the floating buffers after it (a batch norm's running statistics)."""
    model.train()
    model.zero_grad(set_to_none=True)
    with _no_dropout(), same_draws(), torch.enable_grad():
        outputs = model(*inputs)
        tensors = [t for t in capture.tensors_in(outputs) if t.is_floating_point() and t.requires_grad]
        if tensors:
            loss = sum((t.float() ** 2).mean() for t in tensors)
            loss.backward()  # type: ignore[union-attr]
    gradients = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if b.is_floating_point()}
    model.eval()
    return outputs, gradients, buffers


@contextlib.contextmanager
def same_draws(seed: int = 0) -> Iterator[None]:
    """The random numbers a model draws in training mode (a masking of time steps with numpy's or
    Python's generator, torch's), drawn alike by every run inside; the caller's generators are left as
    they were."""
    state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        if numpy is not None:
            numpy.random.seed(seed)
        try:
            yield
        finally:
            random.setstate(state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)


@contextlib.contextmanager
def _no_dropout() -> Iterator[None]:
    """Dropouts that drop nothing (in training mode, for both runs): a random mask drawn in another
    memory layout would differ from eager's without the model computing anything else.  So does the
    attention's dropout where a rewrite passes it to `scaled_dot_product_attention`."""
    functional = torch.nn.functional
    names = ["dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]
    saved = {n: getattr(functional, n) for n in names if hasattr(functional, n)}
    attention = functional.scaled_dot_product_attention

    def identity(input, *args, **kwargs):
        return input

    def attention_without_dropout(*args, **kwargs):
        if len(args) > 4:  # (query, key, value, attn_mask, dropout_p, ...)
            args = (*args[:4], 0.0, *args[5:])
        elif "dropout_p" in kwargs:
            kwargs = dict(kwargs, dropout_p=0.0)
        return attention(*args, **kwargs)

    try:
        for n in saved:
            setattr(functional, n, identity)
        functional.scaled_dot_product_attention = attention_without_dropout
        yield
    finally:
        for n, f in saved.items():
            setattr(functional, n, f)
        functional.scaled_dot_product_attention = attention


@contextlib.contextmanager
def _launches(kernels: ModuleType | None) -> Iterator[dict[str, int]]:
    """Each kernel of the patched module's launches while the block runs."""
    counts: dict[str, int] = {}
    wrapped = []
    for name in [
        n for n, f in (vars(kernels) if kernels is not None else {}).items() if callable(getattr(f, "fits", None))
    ]:
        call = getattr(kernels, f"_{name}_call", None)
        if call is None:
            continue

        def counted(*args: Any, _call: Callable[..., Any] = call, _name: str = name) -> Any:
            counts[_name] = counts.get(_name, 0) + 1
            return _call(*args)

        setattr(kernels, f"_{name}_call", counted)
        wrapped.append((name, call))
    try:
        yield counts
    finally:
        for name, call in wrapped:
            setattr(kernels, f"_{name}_call", call)


def _outputs_check(got: Any, want: Any, precision: torch.dtype | None, applied: list[str], device: str) -> ModelCheck:
    got_tensors, want_tensors = capture.tensors_in(got), capture.tensors_in(want)
    if len(got_tensors) != len(want_tensors):
        return ModelCheck(
            "mismatch",
            applied,
            message=f"the patched model returns {len(got_tensors)} tensor(s), the original {len(want_tensors)}",
        )
    worst = None
    tf32 = device == "cuda" and (torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)
    for a, e in zip(got_tensors, want_tensors, strict=True):
        cmp = compare(a.detach(), e.detach(), precision, TF32 if tf32 else None)
        if worst is None or (worst.ok and (not cmp.ok or cmp.max_abs > worst.max_abs)):
            worst = cmp
    if worst is None:
        return ModelCheck("skipped", applied, message="the model returns no tensors")
    return ModelCheck("matches" if worst.ok else "mismatch", applied, worst.max_abs, worst.max_rel, worst.message)


def _against_float64(
    original: torch.nn.Module, inputs: list[torch.Tensor], got: Any, want: Any, check_: ModelCheck
) -> ModelCheck:
    """`check_`, a narrow model's mismatch with eager, judged again by accuracy: "matches" when every
    output of the patched model is as close to the model run in float64 as eager's is
    (`numerics.as_accurate_as_eager`); `check_` unchanged when the model cannot run in float64."""
    try:
        exact_model = copy.deepcopy(original).to(torch.float64)
        wide = [t.to(torch.float64) if t.is_floating_point() else t for t in inputs]
        with torch.no_grad():
            exact = capture.tensors_in(exact_model(*wide))
    except (RuntimeError, TypeError, ValueError):  # a dtype it insists on, or no memory for the copy
        return check_
    pairs = list(zip(capture.tensors_in(got), capture.tensors_in(want), exact, strict=False))
    if len(pairs) != len(exact) or not all(e.is_floating_point() for _, _, e in pairs):
        return check_
    worst = max((as_accurate_as_eager(g, w, e) for g, w, e in pairs), key=lambda a: (not a.ok, a.error))
    if not worst.ok:
        check_.message = (
            f"{check_.message}; against float64, RMS error {worst.error:.3g} where eager's is {worst.eager_error:.3g}"
        )
        return check_
    message = (
        f"as accurate as eager: RMS error {worst.error:.3g} against the model in float64, eager's "
        f"{worst.eager_error:.3g} (max |difference| from eager {check_.max_abs:.3g})"
    )
    return ModelCheck("matches", check_.applied, check_.max_abs, check_.max_rel, message)
