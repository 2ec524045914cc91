"""Inductor capture: compile a model with torch.compile/Inductor and read back what it fused.

fuselens proposes its own clusters; this module asks the compiler users actually run.  It
compiles the model with Inductor's Triton code generator and returns every kernel Inductor
generated: its name, its kind, the aten ops it computes, the user's ops (as Dynamo captured
them: `x * 2`, `F.gelu`, ...) and source lines those came from, and its Triton text.

How the answer is read, without touching scheduler internals:

- With `config.trace.provenance_tracking_level = 1`, Inductor emits structured-trace
  artifacts on the `torch.__trace` logger: `inductor_provenance_tracking_node_mappings`
  (kernel -> post-grad aten nodes -> pre-grad Dynamo nodes), the post-grad graph (the aten
  target of each node) and the output code (each kernel's Triton source).  A
  `logging.Handler` attached for the duration of the compile collects them.
- The backend we hand to `torch.compile` is Inductor's own `compile_fx`, wrapped so that we
  also see Dynamo's graph (the pre-grad graph the mappings refer to: torch-level op names,
  data edges and each node's stack trace, whose innermost frame in the user's file is the
  op's line) and so that the forward then runs eagerly: the kernels are only needed as text.
- Tensors on the CPU compile with `cpu_backend = "triton"`: Inductor applies its GPU
  fusion rules and emits Triton kernels for CPU tensors.  There is no Triton driver for
  them, so `triton_hash_with_backend` (a cache-key helper) falls back to a constant and the
  compilation of kernel binaries, which only happens when Inductor loads the module it
  wrote, is skipped.  CUDA tensors use the CUDA backend untouched (kernels are compiled).
  The CPU reading is a close proxy, not the same answer: measured with torch 2.11 on an
  H200, on CUDA a Linear's bias add joins the next pointwise kernel (on the CPU `addmm`
  keeps it) and the Llama block's two rotary embeddings, `cat` included, become one kernel
  (on the CPU the `cat` gets kernels of its own).  `InductorCapture.backend` says which.

Pattern rewrites.  Inductor's pattern matcher replaces some subgraphs (e.g. `x * c` feeding
a softmax) with new nodes that carry no provenance, so the replaced user op seems to vanish.
We keep the pattern matcher ON, because turning it off can change what Inductor fuses (the
attention and GEMM rewrites, for instance) and the point is to report what torch.compile
really does.  Instead, an op that maps to no post-grad node at all is placed by adjacency:
if every op consuming its value (looking through views) lives in one kernel, and that kernel
computes aten nodes without provenance (the rewrite's leftovers), the op is attributed to
that kernel and marked `inferred`.  `pattern_matcher=False` is available when exact
provenance matters more than fidelity; on the examples in this repository both settings
give the same kernels.

Isolation: a fresh temporary cache directory (Inductor's and Triton's), caches forced off so
a cache hit can never skip the code that emits provenance, Dynamo reset before and after,
inference mode (eval + no_grad, the model's own modes restored), and every config value,
environment variable, logger handler and stub restored on the way out, exceptions included.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fuselens.contracts.inductor import KERNEL_KINDS, AtenOp, InductorCapture, InductorGraph, InductorKernel, InductorOp

from .capture import UserCode
from .ops import ALIASES, CASTS, OpClass, op_class

# Aten ops that only move or relabel memory.  A user op that reaches a kernel only through
# these (a linear's output reshaped inside the next kernel's indexing, a layout copy) is not
# computed by that kernel.
LAYOUT_ATEN = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "permute",
        "transpose",
        "t",
        "expand",
        "slice",
        "select",
        "squeeze",
        "unsqueeze",
        "as_strided",
        "alias",
        "split",
        "split_with_sizes",
        "unbind",
        "clone",
        "getitem",
        "unfold",
        "diagonal",
        "view_as_real",
        "view_as_complex",
    }
)

# Torch calls Dynamo records that we treat as views (our capture turns them into getitems).
_VIEW_CALLS = frozenset(
    {
        "split",
        "chunk",
        "unbind",
        "split_with_sizes",
        "tensor_split",
        "hsplit",
        "vsplit",
        "view_as",
        "reshape_as",
        "expand_as",
        "contiguous",
        "size",
    }
)


_ARTIFACTS = ("inductor_provenance_tracking_node_mappings", "inductor_post_grad_graph")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ')
_POST_GRAD_NODE = re.compile(r'^\s*(\w+)(?:\s*:\s*"[^"]*")?\s*=\s*(?:torch\.ops\.([\w.]+)\(|(\w+)\[\d+\])')
_POST_GRAD_FILE = re.compile(r"^\s*# File: (.+?):(\d+) in \S+, code:")
_TRITON_KERNEL = re.compile(r"^(\w+) = async_compile\.triton\('\w+', '''(.*?)'''", re.S | re.M)
_LAUNCH = re.compile(r"# \[Provenance debug handles\] (\S+):(\d+)\n\s*(.*)")
_HEURISTIC = re.compile(r"@triton_heuristics\.(\w+)\(")


class InductorCaptureError(Exception):
    """Inductor could not compile the model (the message says why)."""


# ---- the capture -----------------------------------------------------------------------------


def capture_inductor(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    user_code_predicate: Callable[[str], bool] | None = None,
    *,
    pattern_matcher: bool = True,
) -> InductorCapture:
    """Compile `model(*example_inputs)` with Inductor and return the kernels it generated.

    `example_inputs` may be real tensors (used as they are) or meta tensors (replaced by
    small random CPU tensors of the same shape: floats ~ N(0, 1), integers and bools zero, so
    token ids stay valid indices).  A model built on the meta device is copied to
    uninitialised CPU storage; its values do not matter to what Inductor generates.
    `user_code_predicate(filename)` says which files are the user's (default: not torch, the
    standard library or site-packages); an op's line is the innermost frame it accepts.
    """
    start = time.perf_counter()
    is_user = user_code_predicate or UserCode()
    inputs = _real_inputs(example_inputs)
    device = "cuda" if any(t.is_cuda for t in inputs) else "cpu"
    model = _materialised(model, device)
    result = InductorCapture(
        device=device,
        backend="cuda" if device == "cuda" else "triton-cpu",
        pattern_matcher=pattern_matcher,
        torch_version=torch.__version__,
    )
    collector = _ArtifactCollector()

    def backend(gm: torch.fx.GraphModule, backend_inputs):
        from torch._inductor.compile_fx import compile_fx

        nodes = _snapshot(gm, is_user)  # before Inductor's pre-grad passes edit the graph in place
        with collector.collecting() as artifacts:
            compile_fx(gm, backend_inputs)
        nodes.update({k: v for k, v in _snapshot(gm, is_user).items() if k not in nodes})
        graph = _build_graph(len(result.graphs), nodes, artifacts, is_user)
        result.graphs.append(graph)
        return gm.forward  # run eagerly: the compiled kernels were only wanted as text

    with _isolated(device, pattern_matcher), collector.attached(), _inference(model):
        torch._dynamo.reset()
        try:
            torch.compile(model, backend=backend, dynamic=False)(*inputs)
        except Exception as exc:
            raise InductorCaptureError(f"torch.compile failed: {type(exc).__name__}: {_first_line(exc)}") from exc
        finally:
            torch._dynamo.reset()  # leave no compiled frames of ours in Dynamo's caches
    for graph in result.graphs:
        inferred = [op for op in graph.ops if op.inferred]
        if inferred:
            where = ", ".join(f"{op.op} (line {op.line})" for op in inferred)
            result.notes.append(
                f"graph {graph.index}: a pattern rewrite dropped the provenance of {where}; "
                "placed by the kernel that consumes it"
            )
    if len(result.graphs) > 1:
        result.notes.append(f"Dynamo split the forward into {len(result.graphs)} graphs (graph breaks)")
    result.seconds = round(time.perf_counter() - start, 3)
    return result


# ---- isolation -------------------------------------------------------------------------------


@contextlib.contextmanager
def _isolated(device: str, pattern_matcher: bool) -> Iterator[None]:
    """Fresh caches and the settings the capture needs; everything restored afterwards."""
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache

    settings: dict[str, Any] = {
        "trace.provenance_tracking_level": 1,
        "force_disable_caches": True,  # a cache hit would skip the code that emits provenance
        "compile_threads": 1,  # no compile-worker subprocesses (they would outlive us, and fork badly)
        "pattern_matcher": pattern_matcher,
    }
    if device == "cpu":
        settings["cpu_backend"] = "triton"
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")  # "no active CPU backend", "dynamo_pgo force disabled", ...
        stack.enter_context(config.patch(settings))
        stack.enter_context(fresh_cache())  # temp TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, deleted after
        if device == "cpu":
            stack.enter_context(_no_kernel_binaries())
            stack.enter_context(_driverless_backend_hash())
            stack.enter_context(_triton_driver_restored())
        yield


@contextlib.contextmanager
def _swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` for the duration, and what it was afterwards."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _no_kernel_binaries() -> contextlib.AbstractContextManager[None]:
    """Inductor loads the module it generated, and loading compiles each Triton kernel to a
    binary; with no driver for the target that raises.  The capture only wants the text (the
    forward then runs eagerly), so kernel compilation is skipped for its duration.

    (Running the load under TRITON_INTERPRET=1 also avoids the compile, but whatever Triton
    module is first imported then stays interpreted: Inductor's `triton_helpers` would break
    every later CUDA compile in the process.)"""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    return _swapped(CachingAutotuner, "precompile", lambda self, *args, **kwargs: None)


def _driverless_backend_hash() -> contextlib.AbstractContextManager[None]:
    """Inductor puts a hash of the active Triton backend in each kernel's metadata; with no
    driver that call raises.  The hash only keys caches, which are off, so a constant does."""
    import torch.utils._triton as triton_utils

    original = triton_utils.triton_hash_with_backend

    def hash_or_constant() -> str:
        try:
            return original()
        except RuntimeError:
            return "FUSELENS-NO-TRITON-DRIVER"

    return _swapped(triton_utils, "triton_hash_with_backend", hash_or_constant)


@contextlib.contextmanager
def _triton_driver_restored() -> Iterator[None]:
    """Generated CPU kernels call `set_driver_to_cpu()`, which switches Triton's active driver
    when a CPU backend is installed; put back whatever was active before."""
    try:
        from triton.runtime import driver
    except ImportError:
        yield
        return
    active = getattr(driver, "_active", None)  # None: not chosen yet, chosen lazily on first use
    try:
        yield
    finally:
        driver._active = active


@contextlib.contextmanager
def _inference(model: torch.nn.Module) -> Iterator[None]:
    """eval() and no_grad for the capture; every submodule's own training flag restored."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in modes:
            module.training = training


def _real_inputs(example_inputs) -> list[torch.Tensor]:
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = [example_inputs]
    generator = torch.Generator().manual_seed(0)
    out = []
    for t in example_inputs:
        if not isinstance(t, torch.Tensor) or not t.is_meta:
            out.append(t)
        elif t.dtype.is_floating_point:
            out.append(torch.randn(t.shape, generator=generator).to(t.dtype))
        else:
            out.append(torch.zeros(t.shape, dtype=t.dtype))
    return out


def _materialised(model: torch.nn.Module, device: str) -> torch.nn.Module:
    tensors = list(model.parameters()) + list(model.buffers())
    if not any(t.is_meta for t in tensors):
        return model
    return copy.deepcopy(model).to_empty(device=device)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


# ---- collecting the artifacts ----------------------------------------------------------------


class _ArtifactCollector(logging.Handler):
    """Keeps the structured-trace artifacts the provenance reading needs, nothing else."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self._bucket: dict[str, str] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self._bucket is None:
            return
        metadata = getattr(record, "metadata", None) or {}
        payload = getattr(record, "payload", None)
        if "inductor_output_code" in metadata:
            self._bucket["inductor_output_code"] = payload or ""
        name = (metadata.get("artifact") or {}).get("name")
        if name in _ARTIFACTS:
            self._bucket[name] = payload or ""

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        trace_log = logging.getLogger("torch.__trace")
        trace_log.addHandler(self)  # that logger never propagates and is always at DEBUG
        try:
            yield
        finally:
            trace_log.removeHandler(self)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[dict[str, str]]:
        bucket: dict[str, str] = {}
        self._bucket = bucket
        try:
            yield bucket
        finally:
            self._bucket = None


# ---- Dynamo's graph: the user's ops ----------------------------------------------------------


@dataclass
class _PreGradNode:
    name: str
    op: str
    target: str
    file: str
    line: int
    free: bool
    inputs: list[str]
    order: int


def _snapshot(gm: torch.fx.GraphModule, is_user: Callable[[str], bool]) -> dict[str, _PreGradNode]:
    nodes: dict[str, _PreGradNode] = {}
    for order, node in enumerate(gm.graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        op, target = _canonical(node)
        file, line = _user_frame(node.meta.get("stack_trace") or "", is_user)
        inputs = [a.name for a in node.all_input_nodes]
        nodes[node.name] = _PreGradNode(node.name, op, target, file, line, _is_free(op), inputs, order)
    return nodes


def _canonical(node: torch.fx.Node) -> tuple[str, str]:
    """(fuselens op name, display name of the callable) for one Dynamo node."""
    if node.op == "call_method":
        name, display = str(node.target), f"Tensor.{node.target}"  # a method's target is its name
    elif node.op == "call_module":
        name, display = str(node.target).split(".")[-1], f"module {node.target}"
    else:
        name = getattr(node.target, "__name__", str(node.target))
        module = getattr(node.target, "__module__", None) or ""
        display = f"{'operator' if module == '_operator' else module}.{name}" if module else name
        if module == "_operator":  # operator.truediv -> the "__truediv__" alias
            name = f"__{name}__" if f"__{name}__" in ALIASES else name
    alias = ALIASES.get(name, name)
    alias = alias[0] if isinstance(alias, tuple) else alias
    if alias.endswith("_") and not alias.startswith("_") and op_class(alias[:-1]) is not OpClass.OPAQUE:
        alias = alias[:-1]  # in-place form: same computation
    if alias in CASTS or alias in ("to", "type", "type_as"):
        alias = "to_same" if _same_dtype(node) else "cast"
    if alias == "relu6":
        alias = "hardtanh"
    return alias, display


def _same_dtype(node: torch.fx.Node) -> bool:
    out = node.meta.get("example_value")
    src = node.all_input_nodes[0].meta.get("example_value") if node.all_input_nodes else None
    return isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor) and out.dtype == src.dtype


def _is_free(op: str) -> bool:
    if op in _VIEW_CALLS or op == "getitem":
        return True
    if op == "dropout":  # captured in eval mode: the identity
        return True
    return op_class(op).free


def _user_frame(stack_trace: str, is_user: Callable[[str], bool]) -> tuple[str, int]:
    """The innermost frame of a formatted stack trace that is in the user's code."""
    for file, line in reversed(_FRAME.findall(stack_trace)):
        if is_user(file):
            return file, int(line)
    return "", 0


# ---- one compiled graph ----------------------------------------------------------------------


def _build_graph(
    index: int, nodes: dict[str, _PreGradNode], artifacts: dict[str, str], is_user: Callable[[str], bool]
) -> InductorGraph:
    mapping = json.loads(artifacts.get("inductor_provenance_tracking_node_mappings") or "{}")
    kernel_to_post = mapping.get("cppCodeToPost") or {}
    post_to_pre = mapping.get("postToPre") or {}
    targets, post_lines = _post_grad_nodes(artifacts.get("inductor_post_grad_graph", ""), is_user)
    code = artifacts.get("inductor_output_code", "")
    sources = {name: _jit_function(text) for name, text in _TRITON_KERNEL.findall(code)}
    kinds = {name: _heuristic_kind(text) for name, text in _TRITON_KERNEL.findall(code)}
    launches = {(name, int(handle)): call.strip() for name, handle, call in _LAUNCH.findall(code)}

    ops = {name: InductorOp(n.name, n.op, n.target, n.file, n.line, n.free) for name, n in nodes.items()}
    for name, n in nodes.items():
        ops[name].producers = _producers(n, nodes)

    kernels: list[InductorKernel] = []
    for key, post_names in kernel_to_post.items():
        name, _, handle = key.rpartition(":")
        kernel = InductorKernel(
            id=f"g{index}.k{handle}",
            name=name,
            kind=kinds.get(name) or _kind_from_name(name),
            graph=index,
            aten_ops=[],
            user_ops=[],
            lines=[],
            source=sources.get(name) or launches.get((name, int(handle or 0)), ""),
        )
        computed: list[str] = []
        for post in post_names:
            target = targets.get(post, "")
            pre = [p for p in post_to_pre.get(post, []) if p in ops]
            file, line = next(
                ((ops[p].file, ops[p].line) for p in pre if ops[p].line and not ops[p].free),
                post_lines.get(post, ("", 0)),
            )
            layout = _aten_base(target) in LAYOUT_ATEN
            kernel.aten_ops.append(AtenOp(post, target, file, line, pre, layout))
            if layout:
                continue
            if not pre:
                kernel.unattributed += 1
            computed += [p for p in pre if not ops[p].free and p not in computed]
        kernel.user_ops = computed
        for p in computed:
            ops[p].kernels.append(kernel.id)
        kernels.append(kernel)

    by_id = {k.id: k for k in kernels}
    _place_orphans(ops, nodes, post_to_pre, by_id)
    for kernel in kernels:
        kernel.user_ops.sort(key=lambda p: nodes[p].order)
        kernel.lines = [list(fl) for fl in sorted({(ops[p].file, ops[p].line) for p in kernel.user_ops if ops[p].line})]
    ordered = sorted(ops.values(), key=lambda o: nodes[o.name].order)
    unplaced = [o.name for o in ordered if not o.free and not o.kernels]
    return InductorGraph(index, ordered, kernels, unplaced)


def _producers(node: _PreGradNode, nodes: dict[str, _PreGradNode]) -> list[str]:
    """The nearest non-free ops feeding `node`, looking through views and identities."""
    found: list[str] = []
    stack = list(node.inputs)
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:  # placeholders and constants are not ops
            continue
        seen.add(name)
        if nodes[name].free:
            stack.extend(nodes[name].inputs)
        elif name not in found:
            found.append(name)
    return sorted(found, key=lambda n: nodes[n].order)


def _place_orphans(
    ops: dict[str, InductorOp], nodes: dict[str, _PreGradNode], post_to_pre: dict, kernels: dict[str, InductorKernel]
) -> None:
    """Attribute ops whose provenance a pattern rewrite dropped to the kernel consuming them.

    An orphan maps to no post-grad node at all.  If every op reading its value (through
    views, and through other orphans) is computed in one kernel, and that kernel computes
    aten nodes without provenance, the rewritten form of the orphan lives there.
    """
    mapped = {p for pres in post_to_pre.values() for p in pres}
    orphans = {n for n, op in ops.items() if not op.free and n not in mapped}
    consumers: dict[str, list[str]] = {n: [] for n in nodes}
    for n in nodes.values():
        for src in n.inputs:
            if src in consumers:
                consumers[src].append(n.name)
    for orphan in sorted(orphans, key=lambda n: nodes[n].order):
        reached: list[str] = []
        stack, seen = list(consumers[orphan]), set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if ops[name].free or name in orphans:
                stack.extend(consumers[name])
            else:
                reached.append(name)
        if not reached:
            continue
        common = set(ops[reached[0]].kernels)
        for name in reached[1:]:
            common &= set(ops[name].kernels)
        candidates = [k for k in common if kernels[k].unattributed]
        if len(candidates) != 1:
            continue
        kernel = kernels[candidates[0]]
        kernel.user_ops.append(orphan)
        kernel.inferred_ops.append(orphan)
        ops[orphan].kernels.append(kernel.id)
        ops[orphan].inferred = True


def _post_grad_nodes(text: str, is_user: Callable[[str], bool]) -> tuple[dict[str, str], dict[str, tuple[str, int]]]:
    """Aten target of each post-grad node, and the user line its `# File:` comment names."""
    targets: dict[str, str] = {}
    lines: dict[str, tuple[str, int]] = {}
    current: tuple[str, int] = ("", 0)
    for raw in text.splitlines():
        comment = _POST_GRAD_FILE.match(raw)
        if comment:
            file = comment.group(1)
            current = (file, int(comment.group(2))) if is_user(file) else ("", 0)
            continue
        if raw.strip().startswith("# No stacktrace"):
            current = ("", 0)
            continue
        node = _POST_GRAD_NODE.match(raw)
        if node:
            targets[node.group(1)] = node.group(2) or "getitem"
            if current[1]:
                lines[node.group(1)] = current
    return targets, lines


def _aten_base(target: str) -> str:
    """ "aten.mul.Tensor" -> "mul"; "getitem" -> "getitem"."""
    parts = target.split(".")
    return parts[1] if len(parts) >= 2 else target


def _jit_function(source: str) -> str:
    at = source.find("@triton.jit")
    return source[at:].strip() + "\n" if at >= 0 else source


def _heuristic_kind(source: str) -> str:
    match = _HEURISTIC.search(source)
    if not match:
        return "other"
    kind = match.group(1).replace("_", "-")
    return kind if kind in KERNEL_KINDS else "other"


def _kind_from_name(name: str) -> str:
    prefixes = {
        "triton_poi_": "pointwise",
        "triton_red_": "reduction",
        "triton_per_": "persistent-reduction",
        "triton_tem_": "template",
        "triton_for_": "foreach",
    }
    for prefix, kind in prefixes.items():
        if name.startswith(prefix):
            return kind
    return "other" if name.startswith("triton_") else "extern"  # library calls and aten fallbacks
