"""What the probe's opportunities are worth on a GPU: a Llama-style MLP at DRAM size (8192 tokens,
4096 → 11008, bf16), its two GEMM sites (the up and gate projections; the down projection) run dense,
in fp8 and 2:4 sparse, timed, with the relative output error on the probe's batches; once with the weights as
initialised, once with them pruned to 2:4 (where the probe names the 2:4 opportunity).

    python benchmarks/probe_gemm.py [--tokens 8192] [--hidden 4096] [--intermediate 11008] [--batches 2] [--out DIR]
    python benchmarks/probe_gemm.py --dry-run   # the probe's part at a small size, on the CPU

The probe runs the MLP on its batches first (`fuselens.analysis.probe`): its sketches of each site are
printed beside the timings (2:4 fraction, outlier channels, fp8 error).  Then, per site:

- dense: `F.linear` in bf16;
- fp8: both operands in float8 e4m3, `torch._scaled_mm` with a scale per row of the input and per
  output channel of the weight (the input's channels smoothed into the weight) where this torch takes
  them, else one scale each;
- 2:4: the weight pruned to 2:4 (the two largest of every four along the reduction dim) and made
  `torch.sparse.to_sparse_semi_structured`, then `F.linear`.

The GEMMs and their measuring are `fuselens validate --probe`'s (`validate/specialised_gemms.py`,
`validate/specialisations.py`): times are medians of CUDA events over repeated calls, taken in turn;
no CUDA graphs; errors are over all the batches.  Without CUDA the timings are skipped, saying so, and the command exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(h)


def probe_sites(mlp: LlamaMLP, batches: list[torch.Tensor], device: str) -> dict[str, dict]:
    """The probe's sketches of the MLP's up and down sites, by site name."""
    from fuselens.analysis.capture import UserCode
    from fuselens.analysis.probe.data import BatchSource
    from fuselens.analysis.probe.run import probe_model

    source = BatchSource("the benchmark's batches", lambda: iter([(b,) for b in batches]))
    probed = probe_model(mlp, source, len(batches), 1, device, UserCode(roots=(os.path.dirname(__file__),)))
    found = {}
    for site in probed.sites:
        weight = next(r for r in site.roles if r.role == "weight")
        inputs = next(r for r in site.roles if r.role == "input")
        down = inputs.shape[-1] == mlp.down_proj.in_features and weight.shape[0] == mlp.down_proj.out_features
        name = "down" if down else "up"  # (the gate and up projections are one site's shape: folded as "up")
        found.setdefault(name, {})
        found[name] |= {
            "line": site.line,
            "input 2:4": inputs.sparse_24_fraction,
            "weight 2:4": weight.sparse_24_fraction,
            "input outliers": inputs.outlier_channels[:8],
            "fp8 error (input, per-channel)": inputs.fp8_channel_error,
            "opportunities": [o.kind for o in site.opportunities],
        }
    return found


def site_operands(mlp: LlamaMLP, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    with torch.no_grad():
        h = F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)
    return {"up": (x, mlp.up_proj.weight), "down": (h, mlp.down_proj.weight)}


def measure(mlp: LlamaMLP, batches: list[torch.Tensor]) -> dict[str, dict]:
    """Each site's fp8 and 2:4 GEMMs against the dense one, as `fuselens validate --probe` measures them."""
    from fuselens.validate import specialisations, specialised_gemms

    results: dict[str, dict] = {}
    for name in ("up", "down"):
        calls = [site_operands(mlp, batch)[name] for batch in batches]
        channel_max = torch.stack([x.abs().amax(0) for x, _ in calls]).amax(0).float()
        fp8 = specialisations.quantize("fp8", calls, channel_max)
        sparse = specialisations.measure("sparse-2:4", calls, specialised_gemms.sparse_weight)
        x, weight = calls[0]
        flops = 2 * x.shape[0] * weight.shape[0] * weight.shape[1]
        times = {
            "dense": fp8.dense_ms or 0.0,
            "fp8": fp8.specialised_ms or 0.0,
            "fp8 kernel": fp8.kernel_ms or 0.0,
            "2:4": sparse.specialised_ms or 0.0,
        }
        results[name] = {
            "shape": f"{tuple(x.shape)} × {tuple(weight.shape)}ᵀ",
            "ms": times,
            "tflops": {k: flops / (v * 1e-3) / 1e12 if v else 0.0 for k, v in times.items()},
            "speedup": {k: times["dense"] / v if v else 0.0 for k, v in times.items()},
            "relative error": {"fp8": fp8.error, "2:4": sparse.error},
            "fp8 scaling": fp8.implementation + (f" ({fp8.note})" if fp8.note else ""),
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=11008)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="the probe's part only, small, on the CPU")
    parser.add_argument("--out", help="write probe_gemm.json and .md here")
    args = parser.parse_args()
    if args.dry_run:
        args.tokens, args.hidden, args.intermediate = 64, 64, 128
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if device == "cpu" and not args.dry_run:
        print("probe_gemm: no CUDA device here: skipped (fp8 and 2:4 GEMMs need one; --dry-run runs the probe's part)")
        return 0
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    batches = [
        torch.randn(args.tokens, args.hidden, device=device, dtype=dtype, generator=generator)
        for _ in range(args.batches)
    ]
    measured: dict = {"torch": torch.__version__, "size": vars(args), "variants": {}}
    tables = []
    for variant in VARIANTS:
        mlp = mlp_of(variant, args, device, dtype)
        sketches = probe_sites(mlp, batches, device)
        print(json.dumps({variant: {"probe": sketches}}, indent=1))
        if device == "cpu":
            continue
        results = measure(mlp, batches)
        tables.append(_table(variant, results, sketches, args))
        print(tables[-1])
        measured["variants"][variant] = {"sites": results, "probe": sketches}
    if args.out and tables:
        from written import write_results

        measured["device"] = torch.cuda.get_device_name()
        write_results(args.out, "probe_gemm", measured, "\n".join(tables))
    return 0


# The weights as initialised, and the same pruned to 2:4 (as a 2:4-sparse checkpoint is): the probe
# names 2:4 only for the second, and its error there is the sparse kernel's own (none from pruning).
VARIANTS = ("dense weights", "2:4-pruned weights")


def mlp_of(variant: str, args: argparse.Namespace, device: str, dtype: torch.dtype) -> LlamaMLP:
    from fuselens.analysis.probe.numerics import prune_24

    torch.manual_seed(0)
    mlp = LlamaMLP(args.hidden, args.intermediate).to(device=device, dtype=dtype).eval()
    if variant == "2:4-pruned weights":
        with torch.no_grad():
            for linear in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                linear.weight.copy_(prune_24(linear.weight.float()).to(dtype))
    return mlp


def _table(variant: str, results: dict, sketches: dict, args: argparse.Namespace) -> str:
    lines = [
        f"Llama MLP ({variant}), {args.tokens} tokens, {args.hidden} → {args.intermediate}, bf16, "
        f"on {torch.cuda.get_device_name()}",
        "",
        "| site | shape | dense ms | fp8 ms (×) | fp8 kernel alone ms (×) | fp8 error | 2:4 ms (×) | 2:4 error "
        "| probe: weight 2:4, opportunities |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in results.items():
        s = sketches.get(name, {})
        lines.append(
            f"| {name} | {r['shape']} | {r['ms']['dense']:.3f} | {r['ms']['fp8']:.3f} ({r['speedup']['fp8']:.2f}×) | "
            f"{r['ms']['fp8 kernel']:.3f} ({r['speedup']['fp8 kernel']:.2f}×) | "
            f"{r['relative error']['fp8']:.2%} | {r['ms']['2:4']:.3f} ({r['speedup']['2:4']:.2f}×) | "
            f"{r['relative error']['2:4']:.2%} | {s.get('weight 2:4', 0):.1%}, {', '.join(s.get('opportunities', [])) or 'none'} |"
        )
    lines.append("")
    lines.append(
        f"fp8 with {next(iter(results.values()))['fp8 scaling']}; errors are over all the batches. "
        "`fp8 ms` quantizes the input on every call (PyTorch ops of their own: a float32 copy, the smoothing, "
        "the row scales, the cast); `fp8 kernel alone` runs `torch._scaled_mm` on an input quantized ahead, "
        "what it costs where the op before it leaves its output in fp8."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
