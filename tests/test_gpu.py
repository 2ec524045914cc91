"""On a CUDA device: generated kernels match eager at the examples' own sizes, and beat it."""

from __future__ import annotations

import pytest

from fuselens.contracts.config import InputSpec, model_settings
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.pipeline.validate import validate_file

from conftest import example

pytestmark = pytest.mark.gpu


def settings(cls: str, config: dict) -> AnalyzeOptions:
    """Analysis options with `config` for model class `cls`, as the editor's settings give it."""
    return AnalyzeOptions(models={cls: model_settings(config, f"models.{cls}")})


CASES = [  # example, class, inputs, constructor kwargs, param dtype
    ("example_net.py", "ExampleNet", [InputSpec([16384, 1024])], {}, None),
    ("example_net.py", "ExampleNet", [InputSpec([16384, 1024], "bfloat16")], {}, "bfloat16"),
    ("llama_block.py", "LlamaBlock", [InputSpec([2, 1024, 1024], "bfloat16")], {}, "bfloat16"),
    ("conv_block.py", "ResBlock", [InputSpec([8, 128, 64, 64]), InputSpec([8, 512])], {}, None),
    ("branchy.py", "GatedNet", [InputSpec([4096, 1024])], {}, None),
    ("gpt.py", "GPT", [InputSpec([4, 512], "int64")], {"n_layers": 2}, None),
    ("convnext_block.py", "ConvNeXtBlock", [InputSpec([8, 96, 56, 56])], {}, None),
    ("diffusion_block.py", "DiffusionResBlock", [InputSpec([4, 64, 32, 32]), InputSpec([4, 256])], {}, None),
]


@pytest.mark.parametrize("name, cls, specs, init, param_dtype", CASES, ids=[f"{c[0]}-{c[2][0].dtype}" for c in CASES])
def test_kernels_match_eager_on_cuda(name, cls, specs, init, param_dtype):
    config = {"inputs": [{"shape": s.shape, "dtype": s.dtype} for s in specs], "init": init}
    if param_dtype:
        config["param_dtype"] = param_dtype
    report = validate_file(example(name), settings(cls, config), ValidateOptions(shapes=specs, benchmark=False))
    assert report.mode == "cuda" and not report.problems, report.problems
    (model,) = report.models
    assert model.clusters
    for check in model.clusters:
        assert check.status in ("verified", "not-reached"), (check.id, check.status, check.message)
        if check.backward is not None:  # every backward, kernel or not, gives eager's gradients
            assert check.backward.status == "verified", (check.id, check.backward.message)
    assert sum(c.status == "verified" for c in model.clusters) >= 1
    if model.model and model.model.applied:
        assert model.model.status == "matches", model.model.message


def test_fused_kernels_beat_eager_when_dram_bound():
    specs = [InputSpec([16384, 1024])]
    report = validate_file(
        example("example_net.py"),
        settings("ExampleNet", {"inputs": [[16384, 1024]]}),
        ValidateOptions(shapes=specs, benchmark=True),
    )
    (model,) = report.models
    for check in model.clusters:
        t = check.timing
        assert t is not None and t.fused_us > 0 and t.compiled_us > 0
        assert t.speedup_vs_eager > 1.5, (check.id, t)  # three passes over 64 MB become one
        assert t.pct_of_peak > 50, (check.id, t)
    assert model.model.speedup is not None and model.model.speedup > 1.0


def test_other_compile_modes_are_timed_beside_the_default():
    specs = [InputSpec([4096, 1024])]
    report = validate_file(
        example("example_net.py"),
        settings("ExampleNet", {"inputs": [[4096, 1024]]}),
        ValidateOptions(shapes=specs, clusters=["c0"], other_compile_modes=["max-autotune-no-cudagraphs"]),
    )
    (check,) = report.models[0].clusters
    t = check.timing
    assert t is not None and t.compiled_us > 0
    assert (
        set(t.compiled_modes_us) == {"max-autotune-no-cudagraphs"}
        and t.compiled_modes_us["max-autotune-no-cudagraphs"] > 0
    )


WIDE_ROWS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(20000)
        self.gn = nn.GroupNorm(4, 16)

    def forward(self, x, img):
        h = x + 300.0  # far from zero: the one-pass variance must not cancel
        return (F.softmax(x * 2, dim=-1), torch.logsumexp(x * 0.5, -1), self.norm(h), h.var(-1),
                self.gn(img * 2))
"""


def test_looped_row_kernels_match_eager_on_cuda(write_model):
    """Rows too wide for registers: online softmax and shifted-sum variance, compiled for the GPU."""
    specs = [InputSpec([64, 20000]), InputSpec([8, 16, 64, 80])]
    config = {"inputs": [{"shape": s.shape, "dtype": s.dtype} for s in specs]}
    report = validate_file(
        write_model(WIDE_ROWS), settings("Wide", config), ValidateOptions(shapes=specs, benchmark=False)
    )
    assert report.mode == "cuda" and not report.problems, report.problems
    (model,) = report.models
    verified = [c for c in model.clusters if c.status == "verified"]
    assert len(verified) == len(model.clusters) >= 3, [(c.id, c.status, c.message) for c in model.clusters]


LOSS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Loss(nn.Module):
    def forward(self, logits, target):
        return F.cross_entropy(logits.float(), target, ignore_index=3)
"""


def test_a_training_step_is_timed_beside_the_forward_on_cuda(write_model):
    """A language model's loss over a 32k vocabulary: its gradients match eager on the GPU, and its
    training step is timed in eager, torch.compile and the kernels, forward and backward apart."""
    specs = [InputSpec([4096, 32000], "bfloat16"), InputSpec([4096], "int64")]
    config = {"inputs": [{"shape": s.shape, "dtype": s.dtype} for s in specs]}
    report = validate_file(write_model(LOSS), settings("Loss", config), ValidateOptions(shapes=specs, benchmark=True))
    assert report.mode == "cuda" and not report.problems, report.problems
    (check,) = report.models[0].clusters
    assert check.status == "verified", check.message
    assert check.backward is not None and check.backward.status == "verified", check.backward
    t = check.backward.timing
    assert t is not None and t.fused_step_us is not None and t.fused_forward_us is not None
    assert 0 < t.fused_forward_us < t.fused_step_us and t.compiled_step_us > 0
    assert t.step_vs_eager > 1.0, t  # eager writes and keeps the float32 log-probabilities


IN_PLACE = """
import torch
import torch.nn as nn


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(1024, 1024)
        self.scale = nn.Parameter(torch.rand(1024) + 0.5)

    def forward(self, x):
        h = self.proj(x)
        h.mul_(self.scale)
        h += x
        return torch.tanh(h) @ self.proj.weight
"""


def test_a_cluster_writing_into_its_input_in_place_is_checked_and_timed_training_on_cuda(write_model):
    """A cluster that starts by scaling and adding into its input in place: its gradients match eager
    autograd's, and its training step is timed in eager, torch.compile and the kernels."""
    specs = [InputSpec([4096, 1024])]
    config = {"inputs": [{"shape": s.shape, "dtype": s.dtype} for s in specs]}
    report = validate_file(
        write_model(IN_PLACE), settings("InPlace", config), ValidateOptions(shapes=specs, benchmark=True)
    )
    assert report.mode == "cuda" and not report.problems, report.problems
    (check,) = report.models[0].clusters
    assert check.status == "verified", check.message
    assert check.backward is not None and check.backward.status == "verified", check.backward
    t = check.backward.timing
    assert t is not None and t.fused_step_us and t.eager_step_us and t.compiled_step_us


EMBEDDINGS = """
import torch
import torch.nn as nn


class Embeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(1000, 256)
        self.pos = nn.Embedding(512, 256)
        self.norm = nn.LayerNorm(256)

    def forward(self, ids, positions):
        embeds = self.tok(ids) * 2.0
        return self.norm(embeds + self.pos(positions).to(embeds.device))
"""


def test_positions_moved_to_the_embeddings_device_train_on_cuda(write_model):
    """BART's positions, moved to the embeddings' device: the gradients' torch code reads the device from
    an input, so the tables' gradients are computed on the GPU and match eager autograd's."""
    specs = [InputSpec([8, 512], "int64", high=1000), InputSpec([512], "int64", high=512)]
    config = {"inputs": [{"shape": s.shape, "dtype": s.dtype, "high": s.high} for s in specs]}
    report = validate_file(
        write_model(EMBEDDINGS), settings("Embeddings", config), ValidateOptions(shapes=specs, benchmark=False)
    )
    assert report.mode == "cuda" and not report.problems, report.problems
    (check,) = report.models[0].clusters
    assert check.status == "verified", check.message
    assert check.backward is not None and check.backward.status == "verified", check.backward
