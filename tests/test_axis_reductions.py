"""Reductions over any dim, pooling windows, instance and batch norm statistics, `torch.max(x, dim)`
and views between ops, each inside one cluster with the ops around it.

Every case runs in the Triton interpreter against eager: `validate_file` calls each cluster's kernel
on the values a real trace recorded (and its backward kernel, where the cluster trains) through a
kernel module whose torch references refuse to run, so a cluster passes only if its kernels did the
work; the launches are counted by kernel, so a case can say which kernel its layout takes.  Where a
cluster cannot take an op, the analysis names the reason.  Shapes are small and ragged (7 or 11
wide, 33 channels) so that masks and tails are exercised.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections import Counter

import pytest

from fuselens.contracts.config import InputSpec
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.contracts.report import PASS_THROUGH_BACKWARD, TORCH_BACKWARD
from fuselens.pipeline.analyze import analyze_file
from fuselens.pipeline.validate import validate_file
from fuselens.validate.runner import load_kernel_module  # (the `launches` fixture wraps the runner's)

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
F = torch.nn.functional


class _Counted:
    """A kernel whose launches (`kernel[grid](...)`) are counted under its name."""

    def __init__(self, kernel, name: str, counts: Counter):
        self.kernel, self.name, self.counts = kernel, name, counts

    def __getitem__(self, grid):
        self.counts[self.name] += 1
        return self.kernel[grid]


def _refusing(name: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} ran: the kernel did not")

    return refuse


def _kernels_only(module, counts: Counter):
    """`module` with every torch reference refusing to run and every kernel's launches counted; the
    across kernels at any size (these tensors are small enough for the plain ones otherwise)."""
    module._ACROSS_MIN_BYTES = 0
    for name in dir(module):
        if re.fullmatch(r"_cluster\d+(_backward)?_reference", name):
            setattr(module, name, _refusing(name))
        elif re.fullmatch(r"_cluster\d+(_backward(_sums|_last)?)?_kernel_\w+", name):  # (a group norm's stages)
            setattr(module, name, _Counted(getattr(module, name), name, counts))
    return module


@pytest.fixture
def launches(monkeypatch):
    """The kernel launches of the kernel modules validation loads, by kernel (`_kernels_only`)."""
    import fuselens.validate.runner as runner

    counts: Counter = Counter()
    load = runner.load_kernel_module
    monkeypatch.setattr(runner, "load_kernel_module", lambda *a, **k: _kernels_only(load(*a, **k), counts))
    return counts


def _analyzed(path: str, inputs, train: bool = False):
    options = AnalyzeOptions(input_shapes=[s for s, _ in inputs], dtypes=[d for _, d in inputs], train=train)
    report = analyze_file(path, options)
    assert not report.problems, report.problems
    (model,) = report.models
    assert model.status == "analyzed", model.problem
    return report, model, options


def _validated(
    write_model, source: str, inputs, chains: list[str], launches: Counter, trains: bool = True, applies: bool = True
):
    """Analyze and validate `source` at `inputs`: its clusters are exactly `chains`, each verified, its
    forward kernels launched, (`trains`) each one's backward kernel verified, and (`applies`) the model
    with every cluster applied matching the original.  The report and its model."""
    path = write_model(HEADER + textwrap.dedent(source).lstrip("\n"))
    report, model, options = _analyzed(path, inputs)
    found = {c.op_chain: c for c in model.clusters}
    assert sorted(found) == sorted(chains), [(r.ops[0].target, r.reason, r.detail) for r in model.rejections]
    for cluster in model.clusters:
        assert cluster.kernel is not None, cluster.lowering
        if trains:
            kernel = cluster.backward not in (None, PASS_THROUGH_BACKWARD, TORCH_BACKWARD)
            assert kernel, f"{cluster.op_chain}: {cluster.backward_detail}"
    specs = [InputSpec([int(d) for d in s.split(",")], d) for s, d in inputs]
    result = validate_file(path, options, ValidateOptions(interpret=True, shapes=specs))
    assert not result.problems, result.problems
    (checked,) = result.models
    for c in checked.clusters:
        assert c.status == "verified", (c.op_chain, c.status, c.message)
        assert c.instances >= 1
        if trains:
            assert c.backward is not None and c.backward.status == "verified", (c.op_chain, c.backward)
    for cluster in model.clusters:
        assert any(name.startswith(f"_{cluster.kernel.name}_kernel_") for name in launches), (
            cluster.op_chain,
            launches,
        )
        if trains:
            backward = f"_{cluster.kernel.name}_backward_"
            assert any(name.startswith(backward) for name in launches), (cluster.op_chain, launches)
    assert checked.model is not None and checked.model.status == ("matches" if applies else "skipped"), checked.model
    return report, model


def _kernel(report, model, chain: str, counts: Counter):
    """The public function of the cluster `chain`, from the kernel module of `report`, kernels only."""
    (cluster,) = [c for c in model.clusters if c.op_chain == chain]
    folder = os.path.dirname(report.file)
    module = load_kernel_module(report, os.path.join(folder, f"kernels_{cluster.kernel.name}.py"))
    return getattr(_kernels_only(module, counts), cluster.kernel.name)


def _rejected(model) -> dict[str, tuple[str, str]]:
    return {r.ops[0].target: (r.reason, r.detail) for r in model.rejections}


# ---- softmax and reductions over a dim that is not the last -------------------------------------------

SOFTMAX_OVER_CHANNELS = """
    class M(nn.Module):
        def forward(self, x, y):
            return torch.softmax(x * 0.5, dim=1) + 1, F.log_softmax(y - 1, dim=1)
"""


def test_a_softmax_over_channels_reads_each_run_of_pixels_down_the_tiles(write_model, launches):
    """`softmax(x, dim=1)` of NCHW: each pixel's channels are a row, H * W apart in memory; the across
    row kernel takes a block of one row of pixels down its tile and the channels across, so that the
    loads and stores run along memory.  In any other layout (channels-last: each row contiguous) the
    whole-row kernel reads the rows by their strides."""
    inputs = [("2,33,5,7", "float32"), ("3,6,4,9", "float32")]
    report, model = _validated(
        write_model, SOFTMAX_OVER_CHANNELS, inputs, ["mul → softmax → add", "sub → log_softmax"], launches
    )
    for cluster in model.clusters:
        assert launches[f"_{cluster.kernel.name}_kernel_across"] > 0, launches
    fused = _kernel(report, model, "mul → softmax → add", launches)
    launches.clear()
    x = torch.randn(2, 33, 5, 7)
    for laid_out in (x.to(memory_format=torch.channels_last), x.transpose(2, 3).contiguous().transpose(2, 3)):
        torch.testing.assert_close(fused(laid_out), torch.softmax(laid_out * 0.5, dim=1) + 1)
    assert sum(n for name, n in launches.items() if name.endswith("_block")) >= 1, launches


def test_sums_means_extremes_and_variances_over_a_leading_dim_join_their_neighbours(write_model, launches):
    """Each reduction over dim 1 of [3, 33, 20] has rows (3, 20) and 33 columns, 20 apart in memory; a
    sum over dim 0 of [40, 24] has 24 rows, each a column of the matrix."""
    source = """
        class M(nn.Module):
            def forward(self, x, y):
                h = torch.tanh(x)
                centred = h - h.mean(1, keepdim=True)
                spread = h.amax(1, keepdim=True) - h.amin(1, keepdim=True) + h.var(1, keepdim=True)
                return centred * spread + h.sum(1, keepdim=True) * 0.1, torch.exp(y).sum(0) * 2
    """
    inputs = [("3,33,20", "float32"), ("40,24", "float32")]
    chains = ["tanh → mean → sub → amax → amin → sub → var → add → mul → sum → mul → add", "exp → sum → mul"]
    _validated(write_model, source, inputs, chains, launches, trains=False)


def test_a_softmax_over_channels_trains_through_one_backward_kernel(write_model, launches):
    source = """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = nn.Parameter(torch.rand(6, 1, 1) + 0.5)

            def forward(self, x):
                return torch.softmax(x * self.scale, dim=1)
    """
    _validated(write_model, source, [("2,6,5,7", "float32")], ["mul → softmax"], launches)


def test_rows_too_wide_for_registers_are_walked_in_column_blocks(write_model, launches):
    """9000 channels a pixel, 9000 pixels a channel: the looped kernels walk each row in blocks, their
    loads and stores by the tensors' own strides, forward and backward.  Where the input runs along
    the last row dim (NCHW's pixels, for a softmax over its channels or a LayerNorm over them seen as
    NHWC), a block of rows goes down the tiles (`_across_loop`): its online softmax and its shifted
    sums then keep one value a row of the tile."""
    source = """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.bn = nn.BatchNorm2d(4, track_running_stats=False)
                self.ln = nn.LayerNorm(9000)

            def forward(self, x, y, z):
                return torch.softmax(x * 2, dim=1), F.relu(self.bn(y)), self.ln(z.permute(0, 2, 3, 1) + 1)
    """
    inputs = [("1,9000,2,3", "float32"), ("3,4,50,60", "float32"), ("1,9000,2,3", "float32")]
    chains = ["mul → softmax", "batch_norm → relu", "add → layer_norm"]
    _, model = _validated(write_model, source, inputs, chains, launches)
    softmax, norm, layer_norm = (f"_{c.kernel.name}" for c in model.clusters)
    assert launches[f"{softmax}_kernel_across_loop"] and launches[f"{softmax}_backward_kernel_across_loop"], launches
    assert launches[f"{layer_norm}_kernel_across_loop"], launches
    assert launches[f"{norm}_kernel_loop"] and launches[f"{norm}_backward_kernel_loop"], launches


# ---- instance norm, group norm, batch statistics ---------------------------------------------------------

NORMS = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.inorm = nn.InstanceNorm2d(8, affine=True)
            self.batch = nn.BatchNorm2d(8, track_running_stats=False)
            with torch.no_grad():
                for norm in (self.inorm, self.batch):
                    norm.weight.uniform_(0.5, 1.5)
                    norm.bias.uniform_(-1, 1)

        def forward(self, x, y):
            return F.relu(self.inorm(x * 2)), torch.sigmoid(self.batch(y + 1))
"""


def test_instance_norm_and_batch_statistics_train_through_one_kernel_each(write_model, launches):
    """An instance norm normalises each (sample, channel) over its pixels: rows of the kernel.  A batch
    norm without running statistics normalises each channel over the batch and the pixels: rows that
    are the channels, each the batch's runs of pixels.  Their weights' and biases' gradients are
    summed over each row by the backward kernel."""
    inputs = [("2,8,5,7", "float32"), ("3,8,4,6", "float32")]
    _validated(write_model, NORMS, inputs, ["mul → instance_norm → relu", "add → batch_norm → sigmoid"], launches)


def test_a_group_norm_before_a_convolution_is_validated_with_the_gradient_the_convolution_returns(
    write_model, launches
):
    """A GroupNorm + SiLU that only a convolution reads writes channels-last (cuDNN's fastest layout),
    and the convolution's backward returns a channels-last gradient: validation checks (and on a GPU
    times) the cluster's backward with its upstream gradient laid out as its output is, so the
    kernels that read such a gradient along its memory are the ones checked, the sums over each
    (sample, channel)'s 1089 pixels in column blocks."""
    source = """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.GroupNorm(4, 16)
                self.conv = nn.Conv2d(16, 16, 3, padding=1)

            def forward(self, x):
                return self.conv(F.silu(self.norm(x)))
    """
    _, model = _validated(write_model, source, [("2,16,33,33", "float32")], ["group_norm → silu"], launches)
    name = f"_{model.clusters[0].kernel.name}"
    assert launches[f"{name}_kernel_apply"], launches  # written channels-last
    assert launches[f"{name}_backward_sums_kernel_across_loop"] and launches[f"{name}_backward_last_kernel_across"]
    assert not any(k.endswith(("_block", "_tile")) for k in launches if "_backward_" in k), launches


def test_a_norm_that_updates_its_running_statistics_is_left_out_by_name(write_model, launches):
    """In training, `nn.BatchNorm2d` normalises with the batch's statistics and updates its running
    mean and variance in place (an `nn.InstanceNorm2d` that tracks them, with each sample's): a kernel
    returning values would leave them stale, so the norm stays out of the cluster, named, and its
    neighbours still fuse.  In eval mode each is a scale and shift per channel inside the cluster."""
    source = """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.bn = nn.BatchNorm2d(8)
                self.inorm = nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
                with torch.no_grad():
                    for norm in (self.bn, self.inorm):
                        norm.running_mean.uniform_(-1, 1)
                        norm.running_var.uniform_(0.5, 2)

            def forward(self, x, y):
                return torch.sigmoid(self.bn(x * 2 + 1)) - 1, F.gelu(self.inorm(y * 2)) + 1
    """
    path = write_model(HEADER + textwrap.dedent(source).lstrip("\n"))
    inputs = [("2,8,5,7", "float32"), ("2,8,4,6", "float32")]
    _, trained, _ = _analyzed(path, inputs, train=True)
    for norm, whose in (("batch_norm", "the batch's"), ("instance_norm", "each sample's")):
        reason, detail = _rejected(trained)[norm]
        assert reason == "aliasing" and f"{whose} statistics" in detail, detail
        assert "running mean and variance" in detail and "eval mode" in detail, detail
    assert sorted(c.op_chain for c in trained.clusters) == ["gelu → add", "mul → add", "sigmoid → sub"]
    chains = ["mul → add → batch_norm → sigmoid → sub", "mul → instance_norm → gelu → add"]
    _validated(write_model, source, inputs, chains, launches, trains=False)


# ---- spatial means and pooling windows ---------------------------------------------------------------

POOLS = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(4)
            self.pool = nn.MaxPool2d(3, 2, 1)
            with torch.no_grad():
                self.bn.running_mean.uniform_(-1, 1)
                self.bn.running_var.uniform_(0.5, 2)

        def forward(self, x):
            a = F.max_pool2d(F.relu(x), 2)
            b = F.avg_pool2d(x * 2, 2) + 1
            c = F.max_pool2d(torch.sigmoid(x), 3, stride=2) - 0.5
            d = F.adaptive_avg_pool2d(torch.tanh(x), 1).flatten(1) * 3
            e = x * torch.sigmoid(F.relu(x).mean((2, 3), keepdim=True))
            stem = self.pool(F.relu(self.bn(x)))
            f = F.avg_pool2d(torch.exp(x), 3, stride=1, padding=1, count_include_pad=False) - x
            return a, b, c, d, e, stem, f
"""


def test_pooling_windows_and_spatial_means_are_kernels_whose_output_is_the_pooled_tensor(write_model, launches):
    """Each window (or the whole image) is a row of the kernel: the ops before the pool are computed
    at every position of every window, those after it on the pooled values, and only those are
    written.  Padding is masked: a max leaves it out, a mean counts it as zeros or, without
    count_include_pad, divides by the positions inside (a ResNet stem's eval-mode batch norm, ReLU
    and 3 x 3 max pool are one kernel).  The windows' count follows the input's size at call time
    (here 9 x 11 pools, in 3 x 3 windows 2 apart, to 4 x 5; 12 x 7 to 5 x 3), so one kernel pools
    any image."""
    chains = [
        "relu → max_pool2d",
        "mul → avg_pool2d → add",
        "sigmoid → max_pool2d → sub",
        "tanh → adaptive_avg_pool2d → mul",
        "relu → mean → sigmoid → mul",
        "batch_norm → relu → max_pool2d",
        "exp → avg_pool2d → sub",
    ]
    report, model = _validated(write_model, POOLS, [("2,4,9,11", "float32")], chains, launches, trains=False)
    fused = _kernel(report, model, "sigmoid → max_pool2d → sub", launches)
    x = torch.randn(3, 4, 12, 7)
    got = fused(x)
    assert got.shape == (3, 4, 5, 3)
    torch.testing.assert_close(got, F.max_pool2d(torch.sigmoid(x), 3, stride=2) - 0.5)
    padded = _kernel(report, model, "exp → avg_pool2d → sub", launches)
    want = F.avg_pool2d(torch.exp(x), 3, stride=1, padding=1, count_include_pad=False) - x
    torch.testing.assert_close(padded(x), want)


def test_a_global_average_pool_trains_through_one_kernel(write_model, launches):
    """`adaptive_avg_pool2d(x, 1)` is a mean over the pixels: its gradient, the upstream one spread over
    them, is one kernel too."""
    source = """
        class M(nn.Module):
            def forward(self, x):
                return F.adaptive_avg_pool2d(F.silu(x), 1) * 2
    """
    _validated(write_model, source, [("2,6,5,7", "float32")], ["silu → adaptive_avg_pool2d → mul"], launches)


def test_pools_no_window_kernel_computes_say_why(write_model):
    source = HEADER + textwrap.dedent(
        """
        class M(nn.Module):
            def forward(self, x):
                return F.max_pool2d(F.relu(x), 3, stride=2, ceil_mode=True) * 2, F.adaptive_avg_pool2d(x * 2, 2) + 1
        """
    ).lstrip("\n")
    _, model, _ = _analyzed(write_model(source), [("2,4,9,11", "float32")])
    rejected = _rejected(model)
    reason, detail = rejected["max_pool2d"]
    assert reason == "no-lowering" and "ceil_mode=False" in detail
    reason, detail = rejected["adaptive_avg_pool2d"]
    assert reason == "no-lowering" and "output_size=1" in detail


# ---- torch.max(x, dim) and views ------------------------------------------------------------------------


def test_torch_max_and_min_over_a_dim_give_their_values_and_first_indices(write_model, launches):
    """`torch.max(x, dim)` is the row's max and the first column that holds it, in one kernel with the
    ops around it; so is `torch.min`, over a leading dim too.  Its call gives both as one pair, which
    a kernel's call cannot stand in for: the cluster says how to write it so that it applies."""
    source = """
        class M(nn.Module):
            def forward(self, x):
                best = (x * 2).max(1)
                low = torch.min(torch.tanh(x), 0, keepdim=True)
                return best.values + 1, best.indices, low.values - 1, low.indices
    """
    chains = ["mul → max → argmax → add", "tanh → min → argmin → sub"]
    report, model = _validated(write_model, source, [("6,33", "float32")], chains, launches, False, applies=False)
    for cluster, name in zip(model.clusters, ("max", "min"), strict=True):
        assert cluster.applies == "no" and f"torch.arg{name}(x, dim)" in cluster.apply_detail, cluster.apply_detail
    fused = _kernel(report, model, "mul → max → argmax → add", launches)
    ties = torch.randint(0, 3, (5, 40)).float()  # every row has its max many times: the first one counts
    got = {t.dtype: t for t in fused(ties)}
    want = torch.max(ties * 2, dim=1)
    assert torch.equal(got[torch.int64], want.indices)
    assert torch.equal(got[torch.float32], want.values + 1)


def test_amax_and_argmax_written_apart_are_one_kernel_that_applies(write_model, launches):
    source = """
        class M(nn.Module):
            def forward(self, x):
                h = x * 2
                return torch.amax(h, 1) + 1, torch.argmax(h, 1), torch.argmin(torch.tanh(x), 0)
    """
    chains = ["mul → amax → add → argmax", "tanh → argmin"]
    _validated(write_model, source, [("6,33", "float32")], chains, launches, trains=False)


def test_a_view_between_two_ops_stays_in_the_cluster_and_trains(write_model, launches):
    """A view of a value the cluster computes is index arithmetic on the sizes it regroups (the
    launcher holds the input to them): splitting the last dim into 4 x 8, merging two into one."""
    source = """
        class M(nn.Module):
            def forward(self, x, y):
                h = (x * 2).view(x.shape[0], 4, 8)
                return torch.relu(h) + 1, torch.sigmoid(y).reshape(y.shape[0], -1) * 3
    """
    inputs = [("6,32", "float32"), ("3,4,5", "float32")]
    _validated(write_model, source, inputs, ["mul → relu → add", "sigmoid → mul"], launches)
