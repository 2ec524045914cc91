"""Training with the applied kernels: forward + backward time and memory against eager and torch.compile.

    python benchmarks/training.py [--tokens 8192 16384] [--only NAME ...] [--out DIR]

Each case (`CASES`) is a model file written the way people write these layers, analyzed and applied
once at a small shape (the kernels read every size at call time), then timed at LLM sizes in bf16
(hidden 4096) on one CUDA device, in one process, by CUDA-graph replay, the replays sampled in turn:

- eager, the model as written;
- torch.compile of the model, mode "default", and mode "max-autotune-no-cudagraphs";
- the applied model (its fused forward kernels and their backward kernels).

One step is the forward and `torch.autograd.grad` of its output, with a fixed random upstream
gradient, with respect to the inputs and the parameters (no `.grad` accumulation in the timing).
"held" is what the forward leaves allocated for the backward (its output included); "peak" what one
step allocates at its peak, both beyond the inputs (`torch.cuda.memory_allocated`).  The loss case
is over a 128256-word vocabulary, and so is the head + loss case (a [tokens, 4096] → 128256 projection
and its cross-entropy, rewritten as one fused loss: the target is a peak at most half torch.compile's,
no slower); the GroupNorm case over a U-Net's [tokens / 128, 512, 32, 32]; the
last case is one training step of the whole Llama block
example.  The kernels were not tuned on this suite.
Writes training.json and training.md to --out.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from model_files import load_model_file  # noqa: E402
from provenance import line as provenance_line  # noqa: E402
from provenance import provenance  # noqa: E402
from written import write_results  # noqa: E402

HEADER = "import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
RMSNORM = """
class RMSNorm(nn.Module):
    def __init__(self, dim=4096, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight
"""
ROTATE_HALF = """
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
"""


def _example(name: str) -> str:
    with open(os.path.join(ROOT, "examples", name), encoding="utf-8") as fh:
        return fh.read()


# name -> (source, the class to time, its inputs at `tokens` tokens: [(shape, kind)]), where kind is
# True / False for a bf16 tensor that wants a gradient or not, or a number of classes for int64
# targets below it (a tenth of them -100, the ignore_index people pad with, for a loss that has one).
CASES = {
    "RMSNorm": (
        RMSNORM + "\n\nclass Model(RMSNorm):\n    pass\n",
        lambda t: [((t, 4096), True)],
    ),
    "LayerNorm + residual": (
        """
class Model(nn.Module):
    def __init__(self, dim=4096):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, y):
        return self.norm(x + y)
""",
        lambda t: [((t, 4096), True), ((t, 4096), True)],
    ),
    "residual + RMSNorm": (
        RMSNORM
        + """

class Model(nn.Module):
    def __init__(self, dim=4096):
        super().__init__()
        self.norm = RMSNorm(dim)

    def forward(self, x, attn):
        x = x + attn
        return x, self.norm(x)
""",
        lambda t: [((t, 4096), True), ((t, 4096), True)],
    ),
    "SwiGLU": (
        """
class Model(nn.Module):
    def forward(self, gate, up):
        return F.silu(gate) * up
""",
        lambda t: [((t, 11008), True), ((t, 11008), True)],
    ),
    "RoPE": (
        ROTATE_HALF
        + """

class Model(nn.Module):
    def __init__(self, heads=32, head_dim=128, max_len=16384):
        super().__init__()
        freqs = torch.outer(torch.arange(max_len).float(), 1.0 / 10000 ** (torch.arange(0, head_dim, 2) / head_dim))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, q):
        n = q.shape[-2]
        cos, sin = self.cos[:n].to(q.dtype), self.sin[:n].to(q.dtype)
        return q * cos + rotate_half(q) * sin
""",
        lambda t: [((t // 2048, 32, 2048, 128), True)],
    ),
    "softmax (attention scores)": (
        """
class Model(nn.Module):
    def forward(self, scores):
        return F.softmax(scores.float() / math.sqrt(128), dim=-1).type_as(scores)
""",
        lambda t: [((t // 2048, 8, 2048, 2048), True)],
    ),
    # A language model's loss over a Llama-3 vocabulary, as people write it: the gradient of the
    # bf16 logits, which the float32 log-probabilities eager keeps for the backward never need.
    "cross-entropy (vocabulary 128256)": (
        """
class Model(nn.Module):
    def forward(self, logits, target):
        return F.cross_entropy(logits.float(), target, ignore_index=-100)
""",
        lambda t: [((t, 128256), True), ((t,), 128256)],
    ),
    "per-token log-softmax pick (vocabulary 128256)": (
        """
class Model(nn.Module):
    def forward(self, logits, target):
        return -F.log_softmax(logits.float(), dim=-1).gather(-1, target[..., None])
""",
        lambda t: [((t, 128256), True), ((t,), 128256)],
    ),
    # A language model's head and its loss, as people write them: a 128k vocabulary over hidden 4096, the
    # logits flattened and upcast.  Applied, the two statements are one fused loss (F.linear_cross_entropy
    # where torch has it; on torch 2.11 the kernel module's chunked loss), which never writes the logits.
    "head + cross-entropy (vocabulary 128256)": (
        """
class Model(nn.Module):
    def __init__(self, hidden=4096, vocab=128256):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, h, targets):
        logits = self.lm_head(h)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-100)
        return loss
""",
        lambda t: [((t, 4096), True), ((t,), 128256)],
    ),
    # A diffusion U-Net's norm and activation: GroupNorm over 32 groups of 16 channels, then SiLU,
    # over [tokens / 128, 512, 32, 32] (64 MiB at 8192 "tokens").
    "GroupNorm + SiLU": (
        """
class Model(nn.Module):
    def __init__(self, channels=512):
        super().__init__()
        self.norm = nn.GroupNorm(32, channels)

    def forward(self, x):
        return F.silu(self.norm(x))
""",
        lambda t: [((t // 128, 512, 32, 32), True)],
    ),
    # One training step of a whole block: the shipped Llama example (dim 1024, 8 heads, SwiGLU 2816).
    "Llama block (examples/llama_block.py)": (
        _example("llama_block.py") + "\n\nclass Model(LlamaBlock):\n    pass\n",
        lambda t: [((t // 2048, 2048, 1024), True)],
    ),
}
IMPLEMENTATIONS = ["eager", "compile_default", "compile_max_autotune_no_cudagraphs", "applied"]


def applied_models(source: str, name: str, inputs: list[tuple[tuple[int, ...], bool]]):
    """(the model class as written, the class after `fuselens apply` of every cluster, what applied)."""
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file

    folder = tempfile.mkdtemp(prefix="fuselens-training-")
    path = os.path.join(folder, f"{name}.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(HEADER + textwrap.dedent(source).lstrip())
    original = load_model_file(path, f"original_{name}").Model
    shapes = [",".join(map(str, shape)) for shape, _ in inputs]
    dtypes = ["bfloat16" if isinstance(kind, bool) else "int64" for _, kind in inputs]
    options = AnalyzeOptions(input_shapes=shapes, dtypes=dtypes, param_dtype="bfloat16")
    result = apply_file(path, options, None, lambda _: True)
    if not result.applied:
        raise SystemExit(f"{name}: nothing applied: {result.skipped}")
    return original, load_model_file(path, f"applied_{name}").Model, result.applied


def memory(fn) -> tuple[int, int]:
    """(what `fn`'s forward leaves allocated, the peak of one whole step), beyond what was allocated."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    held = fn(forward_only=True)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    del held
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return kept, peak


def step(model, inputs, upstream, forward_only=False):
    """The forward, and the gradients of its outputs (weighted by `upstream`) for inputs and parameters."""
    import torch

    out = model(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    if forward_only:
        return outs
    wrt = [t for t in inputs if t.requires_grad] + [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(outs, wrt, upstream)


def print_kernel_times(fns: dict, steps: int = 10, shown: int = 16) -> None:
    """Each model's GPU kernels in one step (µs a step, from the profiler over `steps` steps): where
    a step's time goes, kernel by kernel, the `shown` longest, then all of them together."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        events.sort(key=lambda e: -e.self_device_time_total)
        print(f"  {name}: kernels a step")
        for e in events[:shown]:
            print(f"    {e.self_device_time_total / steps:8.1f} µs  x{e.count // steps}  {e.key[:110]}")
        total = sum(e.self_device_time_total for e in events) / steps
        print(f"    {total:8.1f} µs  all {sum(e.count for e in events) // steps} kernels")


def case_input(shape, kind, ignored: bool = True):
    """One input of a case (`CASES`): bf16 values, or int64 targets, a tenth of them ignored where
    the loss ignores any (a gather has no ignore_index)."""
    import torch

    if isinstance(kind, bool):
        return torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_(kind)
    target = torch.randint(0, kind, shape, device="cuda")
    return target.masked_fill(torch.rand(shape, device="cuda") < 0.1, -100) if ignored else target


def run_case(name: str, tokens: int, classes, autotune: bool = True, kernels: bool = False) -> dict:
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    original, applied = classes
    torch.manual_seed(0)
    a = original().cuda().to(torch.bfloat16)
    b = applied().cuda().to(torch.bfloat16)
    b.load_state_dict(a.state_dict())
    ignored = "ignore_index" in CASES[name][0]
    inputs = [case_input(shape, kind, ignored) for shape, kind in CASES[name][1](tokens)]
    with torch.no_grad():
        outs = a(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    generator = torch.Generator(device="cuda").manual_seed(1)
    upstream = [torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=generator) for o in outs]
    del outs
    models = {"eager": a, "compile_default": torch.compile(a, dynamic=False), "applied": b}
    if autotune:  # minutes of autotuning for a whole block's forward and backward
        models["compile_max_autotune_no_cudagraphs"] = torch.compile(
            a, mode="max-autotune-no-cudagraphs", dynamic=False
        )
    fns = {n: functools.partial(step, m, inputs, upstream) for n, m in models.items()}
    want = fns["eager"]()
    got = fns["applied"]()
    diff = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want, strict=True))
    scale = max(w.float().abs().max().item() for w in want)
    del want, got
    memories = {n: memory(fn) for n, fn in fns.items()}
    graphs = {}
    for n, fn in fns.items():
        try:
            graphs[n] = graph_replay(fn)
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            print(f"  {n}: not captured ({type(exc).__name__}: {str(exc)[:120]})", file=sys.stderr)
    times = medians_in_turn(graphs, 15)
    if kernels:
        print_kernel_times(fns)
    return {
        "case": name,
        "tokens": tokens,
        "graph_us": times,
        "held_bytes": {n: m[0] for n, m in memories.items()},
        "peak_bytes": {n: m[1] for n, m in memories.items()},
        "max_abs_grad_diff": diff,
        "grad_scale": scale,
    }


def markdown(rows: list[dict], device: str, versions: str) -> str:
    lines = [
        f"Device: {device}; {versions}",
        "",
        "| case | tokens | " + " | ".join(f"{n} µs" for n in IMPLEMENTATIONS) + " | applied vs eager | "
        "applied vs better compile | held MiB (eager / compile default / applied) | "
        "peak MiB (eager / compile default / applied) | max grad diff (of) |",
        "|" + "---|" * (len(IMPLEMENTATIONS) + 7),
    ]
    for r in rows:
        g = {n: r["graph_us"].get(n, float("nan")) for n in IMPLEMENTATIONS}
        better = min(v for v in (g["compile_default"], g["compile_max_autotune_no_cudagraphs"]) if v == v)  # not NaN
        held = " / ".join(f"{r['held_bytes'][n] / 2**20:.0f}" for n in ("eager", "compile_default", "applied"))
        peak = " / ".join(f"{r['peak_bytes'][n] / 2**20:.0f}" for n in ("eager", "compile_default", "applied"))
        lines.append(
            f"| {r['case']} | {r['tokens']} | "
            + " | ".join(f"{g[n]:.1f}" if g[n] == g[n] else "—" for n in IMPLEMENTATIONS)
            + f" | {g['eager'] / g['applied']:.2f}× | {better / g['applied']:.2f}× | {held} | {peak} | "
            f"{r['max_abs_grad_diff']:.2g} ({r['grad_scale']:.2g}) |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--only", choices=list(CASES), action="append", help="default: all")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget-s", type=float, default=0, help="start no case after this many seconds")
    parser.add_argument(
        "--no-autotune", action="append", default=[], metavar="CASE",
        help="time CASE against compile mode default only (its max-autotune column stays empty)",
    )  # fmt: skip
    parser.add_argument("--kernels", action="store_true", help="also print each model's kernel times a step")
    args = parser.parse_args()
    import time

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    begun = time.perf_counter()
    measured_with = provenance()
    device, versions = torch.cuda.get_device_name(), provenance_line(measured_with)
    os.makedirs(args.out, exist_ok=True)
    rows, applied = [], {}
    for index, name in enumerate(args.only or list(CASES)):
        shapes = CASES[name][1](args.tokens[0])  # (analysis runs on meta tensors: any size is free)
        original, patched, applied[name] = applied_models(CASES[name][0], f"case_{index}", shapes)
        for tokens in args.tokens:
            if args.budget_s and time.perf_counter() - begun > args.budget_s:
                print(f"time budget spent: skipping {name} at {tokens} tokens", file=sys.stderr)
                continue
            print(f"… {name}: {tokens} tokens", file=sys.stderr, flush=True)
            try:
                rows.append(run_case(name, tokens, (original, patched), name not in args.no_autotune, args.kernels))
            except Exception as exc:  # a case that fails is a finding, not a lost run
                print(f"  {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            text = markdown(rows, device, versions)  # after each size: a cut run keeps what it measured
            measured = {"device": device, "provenance": measured_with, "applied": applied, "rows": rows}
            write_results(args.out, "training", measured, text)
    print(markdown(rows, device, versions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
