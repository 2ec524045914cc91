"""What a worker child does with one job: plain functions from a job dict to a result dict.

Runs inside a forked child of the worker host, so it may import the user's code, change
directories or leak memory: the child exits when the job is done.
"""

from __future__ import annotations

from typing import Any, Callable

Progress = Callable[[str, float | None], None]


def run_job(job: dict[str, Any], progress: Progress) -> dict[str, Any]:
    kind = job.get("kind")
    if kind == "analyze":
        return analyze(job)
    if kind == "validate":
        return validate(job, progress)
    if kind == "inductor":
        from fuselens.worker.inductor import comparison_job

        options = _analyze_options(dict(job.get("options") or {}, source_text=job.get("text")))
        return comparison_job(job["path"], options, progress)
    if kind == "ping":
        return {"pong": True}
    raise ValueError(f"unknown job kind {kind!r}")


def _analyze_options(options: dict[str, Any]):
    from fuselens.worker.analyze import AnalyzeOptions

    known = AnalyzeOptions.__dataclass_fields__
    return AnalyzeOptions(**{k: v for k, v in options.items() if k in known})


def analyze(job: dict[str, Any]) -> dict[str, Any]:
    from fuselens.worker.analyze import analyze_file

    options = _analyze_options(dict(job.get("options") or {}, source_text=job.get("text")))
    return analyze_file(job["path"], options).to_dict()


def validate(job: dict[str, Any], progress: Progress) -> dict[str, Any]:
    from fuselens.validate.runner import ValidateOptions, validate_file

    settings = job.get("validate") or {}
    options = ValidateOptions(interpret=bool(settings.get("interpret")), clusters=settings.get("clusters"),
                              benchmark=bool(settings.get("benchmark", True)))
    analyze_options = _analyze_options(dict(job.get("options") or {}, source_text=job.get("text")))
    return validate_file(job["path"], analyze_options, options, progress).to_dict()


def warm_up() -> None:
    """Exercise every lazy import and first-call path once, so forked jobs start hot."""
    import os
    import tempfile

    from fuselens.worker.analyze import AnalyzeOptions, analyze_file

    source = (
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
        "        return F.softmax(torch.tanh(h) * 3.0, dim=-1)[..., :8].contiguous()\n"
    )
    with tempfile.TemporaryDirectory(prefix="fuselens-warm-") as tmp:
        path = os.path.join(tmp, "warm.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(source)
        analyze_file(path, AnalyzeOptions(source_text=source))
