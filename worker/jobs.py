"""What a worker child does with one job: a typed job in, the plain form of its result out.

Runs inside a forked child of the worker host, so it may import the user's code, change
directories or leak memory: the child exits when the job is done.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from fuselens.contracts.options import Progress
from fuselens.contracts.plain import to_plain

from .protocol import AnalyzeJob, CompareJob, GenerateJob, Job, PingJob, Pong, ProbeJob, ProfileJob, ValidateJob


def run_job(job: Job, progress: Progress) -> dict[str, Any]:
    if isinstance(job, AnalyzeJob | GenerateJob):
        from fuselens.pipeline.analyze import analyze_file

        return analyze_file(job.path, job.options, code=isinstance(job, GenerateJob)).to_dict()
    if isinstance(job, ValidateJob):
        from fuselens.pipeline.validate import validate_file

        return validate_file(job.path, job.options, job.validate, progress).to_dict()
    if isinstance(job, CompareJob):
        from fuselens.pipeline.compare import compare_file

        return dict(to_plain(compare_file(job.path, job.options, progress)))
    if isinstance(job, ProfileJob):
        from fuselens.pipeline.profile import profile_file

        return profile_file(job.path, job.options, job.profile, progress).to_dict()
    if isinstance(job, ProbeJob):
        from fuselens.pipeline.probe import probe_file

        return probe_file(job.path, job.options, job.probe, progress).to_dict()
    if isinstance(job, PingJob):
        return dict(to_plain(Pong()))
    raise TypeError(f"not a job: {job!r}")


WARM_UP_MODEL = (
    "import torch, torch.nn as nn, torch.nn.functional as F\n"
    "class Warm(nn.Module):  # fuselens: input=(8, 16)\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.proj = nn.Linear(16, 16)\n"
    "        self.norm = nn.LayerNorm(16)\n"
    "        self.emb = nn.Embedding(32, 16)\n"
    "        self.conv = nn.Conv2d(4, 4, 3, padding=1)\n"
    "        self.group = nn.GroupNorm(2, 4)\n"
    "    def forward(self, x):\n"
    "        x = x + self.emb(torch.arange(16, device=x.device)).sum(0)\n"
    "        c = F.silu(self.group(self.conv(x[:4].view(1, 4, 4, 4))))\n"
    "        x = x + c.flatten()[:16] + F.rms_norm(x, (16,))\n"
    "        h = F.gelu(self.proj(x * 2.0 + 1.0))\n"
    "        h = torch.sigmoid(h).pow(2).mean(-1, keepdim=True) * h\n"
    "        h = self.norm(h.float() + x).to(torch.bfloat16).float()\n"
    "        t = h.view(1, 8, 2, 8).transpose(1, 2)\n"
    "        a = torch.softmax((t @ t.transpose(-2, -1)) / 2.0, dim=-1) @ t\n"
    "        h = h + (a + F.scaled_dot_product_attention(t, t, t)).transpose(1, 2).reshape(8, 16)\n"
    "        return F.softmax(torch.tanh(h) * 3.0, dim=-1)[..., :8].contiguous()\n"
)


def _loaded_from(module: object, folder: str) -> bool:
    origin = getattr(module, "__file__", None)
    return isinstance(origin, str) and os.path.dirname(os.path.abspath(origin)) == folder


def warm_up() -> None:
    """Exercise every lazy import and first-call path once, so forked jobs start hot."""
    import tempfile

    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.analyze import analyze_file

    search_path = list(sys.path)
    tmp = ""
    try:
        with tempfile.TemporaryDirectory(prefix="fuselens-warm-") as tmp:
            path = os.path.join(tmp, "warm.py")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(WARM_UP_MODEL)
            analyze_file(path, AnalyzeOptions(source_text=WARM_UP_MODEL))
    finally:
        # Analysing a file puts its folder on sys.path.  This one is deleted now, and anyone may
        # create a folder of the same name in /tmp: left there, a module planted in it would be
        # imported by every job ahead of the standard library.
        sys.path[:] = search_path
        for name in [n for n, m in sys.modules.items() if _loaded_from(m, tmp)]:
            del sys.modules[name]
