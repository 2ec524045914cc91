"""Capture: a forward pass on meta tensors becomes a graph with source lines, shapes and names."""

from __future__ import annotations

import resource

import torch

from fuselens.analysis import capture, loader
from fuselens.analysis.ops import OpClass
from fuselens.contracts.config import InputSpec

from conftest import example


def _trace(path: str, cls: str, specs: list[InputSpec], **kw):
    user = capture.UserCode()
    module = loader.import_file(path, user)
    model = loader.build(loader.model_classes(module)[cls], kw.pop("init", {}), user, "").model
    names = loader.forward_input_names(model, len(specs))
    return capture.trace(model, loader.meta_inputs(specs), names, user, **kw)


def _ops(graph):
    return [n for n in graph if n.cls not in (OpClass.SOURCE,) and n.op != "output"]


def test_ops_carry_the_users_line_not_torch_internals():
    t = _trace(example("example_net.py"), "ExampleNet", [InputSpec([64, 1024])])
    with open(example("example_net.py"), encoding="utf-8") as fh:
        source = fh.read().splitlines()
    by_op = [(n.op, source[n.line - 1].strip()) for n in _ops(t.graph)]
    assert by_op[:3] == [("mul", "x = x * 2.0"), ("relu", "x = F.relu(x)"), ("add", "x = x + 1.0")]
    linear = next(n for n in t.graph if n.op == "linear")
    assert source[linear.line - 1].strip() == "x = self.proj1(x)"  # not torch/nn/modules/linear.py
    assert linear.module == "proj1"


def test_a_huge_input_costs_no_memory():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = _trace(example("example_net.py"), "ExampleNet", [InputSpec([65536, 4096])], init={"width": 4096})
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert t.graph[1].meta.shape == (65536, 4096)  # 1 GiB of float32 if it were real
    assert (after - before) < 200 * 1024  # KiB


def test_real_model_code_traces(write_model):
    path = write_model("""
        import torch, torch.nn as nn, torch.nn.functional as F

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("cos", torch.randn(512, 16))
                self.emb = nn.Embedding(100, 32)

            def forward(self, ids, x):
                s = ids.shape[1]
                h = self.emb(ids).float()
                a, b = h.chunk(2, dim=-1)
                q = a.view(2, s, 4, 4).transpose(1, 2).reshape(2, 4, s * 4)
                r = b.to(torch.float16).pow(2) * self.cos[:s]
                return q.sum(-1), r, x.split(3, dim=0)[1]
    """)
    t = _trace(path, "Net", [InputSpec([2, 10], "int64"), InputSpec([9, 5])])
    ops = [n.op for n in _ops(t.graph)]
    # .float() of a float32 tensor moves nothing, but it is kept, as an identity: a kernel's torch code
    # must cast where the model does when the model runs in another dtype
    assert ops[:3] == ["embedding", "to_same", "getitem"]
    assert next(n for n in t.graph if n.op == "to_same").cls is OpClass.IDENTITY
    assert "pow" in ops and "sum" in ops
    by_op = {n.op: n for n in _ops(t.graph)}
    assert by_op["mul"].meta.shape == (2, 10, 16) and by_op["mul"].meta.dtype == "float32"
    sliced = [n for n in t.graph if n.op == "getitem" and n.meta.shape == (10, 16)]
    assert sliced, "self.cos[:s] is sliced by the sequence length"
    assert by_op["cast"].meta.dtype == "float16"


def test_data_dependent_branch_is_a_graph_break_and_both_sides_are_kept():
    t = _trace(example("branchy.py"), "GatedNet", [InputSpec([64, 1024])])
    assert len(t.graph.breaks) == 1
    brk = t.graph.breaks[0]
    assert brk.line == 19 and "if h.mean() > 0" in brk.code and "data-dependent" in brk.reason
    pieces = {n.op: n.piece for n in _ops(t.graph)}
    assert pieces["silu"] == 0 and pieces["sigmoid"] == 1
    other = _trace(example("branchy.py"), "GatedNet", [InputSpec([64, 1024])], decisions=[False])
    assert "tanh" in [n.op for n in other.graph] and "sigmoid" not in [n.op for n in other.graph]


def test_reading_a_value_stops_the_trace_but_keeps_what_came_before(write_model):
    path = write_model("""
        import torch, torch.nn as nn

        class Net(nn.Module):
            def forward(self, x):
                y = torch.relu(x) * 2
                n = int(y.sum().item())
                return y[:n] + 1
    """)
    t = _trace(path, "Net", [InputSpec([8, 8])])
    assert not t.complete
    assert t.graph.breaks[-1].line == 6 and "item" in t.graph.breaks[-1].reason
    assert [n.op for n in _ops(t.graph)][:2] == ["relu", "mul"]


def test_free_ops_are_identities(write_model):
    path = write_model("""
        import torch, torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.drop = nn.Dropout(0.5)
                self.ident = nn.Identity()

            def forward(self, x):
                y = self.drop(x * 2).contiguous()
                return self.ident(y).float() + 1
    """)
    t = _trace(path, "Net", [InputSpec([4, 4])])
    classes = {n.op: n.cls for n in _ops(t.graph)}
    # eval-mode dropout, nn.Identity, contiguous() of a contiguous tensor and a same-dtype
    # cast either return their input (nothing recorded) or are identities: none moves data
    assert all(cls in (OpClass.IDENTITY, OpClass.BINARY) for cls in classes.values()), classes
    assert [n.op for n in _ops(t.graph) if n.cls.absorbable] == ["mul", "add"]


def test_inplace_ops_are_marked(write_model):
    path = write_model("""
        import torch, torch.nn as nn, torch.nn.functional as F

        class Net(nn.Module):
            def forward(self, x):
                y = x * 2
                y.add_(1)
                F.relu(y, inplace=True)
                return y
    """)
    t = _trace(path, "Net", [InputSpec([4, 4])])
    inplace = [n for n in t.graph if n.inplace]
    assert [n.op for n in inplace] == ["add", "relu"]
    assert inplace[0].params["mutates"] == next(n.id for n in t.graph if n.op == "mul")


def test_operand_names_are_the_callers_locals():
    t = _trace(example("llama_block.py"), "LlamaBlock", [InputSpec([1, 8, 1024], "bfloat16")])
    mul_weight = [n for n in t.graph if n.op == "mul" and n.line == 21][-1]
    assert "self.weight" in mul_weight.operand_names.values()
    cast = next(n for n in t.graph if n.op == "cast")
    assert list(cast.operand_names.values()) == ["x"]


def test_a_failing_forward_names_the_users_line_and_cause(write_model):
    path = write_model("""
        import torch, torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(16, 8)

            def forward(self, x):
                h = x * 2
                return self.proj(h)
    """)
    try:
        _trace(path, "Net", [InputSpec([4, 10])])
    except capture.CaptureError as exc:
        assert exc.frame.line == 10
        assert "RuntimeError" in str(exc) and "[4, 10]" in str(exc)
    else:
        raise AssertionError("a shape mismatch must fail the trace")


def test_recorded_values_keep_the_models_aliasing_and_what_was_there_before_an_inplace_write():
    """Validation replays kernels on recorded values: slices of one tensor must stay slices of
    one tensor (so a kernel reads what it would read in the model), and a tensor written in
    place later must still hold the values it had when it was recorded."""

    class Rope(torch.nn.Module):
        def forward(self, x):
            q = (x * 2).view(2, 4, 3, 8).transpose(1, 2)
            rotated = torch.cat((-q[..., 4:], q[..., :4]), dim=-1)
            x.mul_(3)
            return q + rotated, x + 1

    x = torch.randn(2, 4, 24)
    t = capture.trace(Rope(), [x.clone()], ["x"], capture.UserCode(), real=True)
    by_op = {}
    for n in t.graph:
        by_op.setdefault(n.op, []).append(n.id)
    q = t.values[by_op["transpose"][0]]
    halves = [t.values[i] for i in by_op["getitem"]]
    assert q.stride() == (96, 8, 24, 1)
    assert all(h.untyped_storage().data_ptr() == q.untyped_storage().data_ptr() for h in halves)
    torch.testing.assert_close(q, (x * 2).view(2, 4, 3, 8).transpose(1, 2))
    torch.testing.assert_close(t.values[by_op["input"][0]], x)  # before x.mul_(3)
    written = t.values[by_op["mul"][1]]
    torch.testing.assert_close(written, x * 3)
    assert written.untyped_storage().data_ptr() != t.values[by_op["input"][0]].untyped_storage().data_ptr()


def _numbers(graph):
    """(op, the number as the call spells it, what each frame calls it) for every number of the
    model's state the ops took."""
    from fuselens.analysis.graph import is_named

    return [(n.op, v.text, sorted(v.at.values())) for n in graph for v in [*n.args, *n.params.values()] if is_named(v)]


def test_numbers_read_from_the_model_carry_what_each_frame_calls_them(write_model):
    path = write_model(
        """
        import math
        from math import pi
        import torch
        import torch.nn as nn

        EPS = 1e-5
        LO, HI = -2.0, 2.0

        class Norm(nn.Module):
            def __init__(self, eps):
                super().__init__()
                self.eps = eps

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

        def scaled(x, scaling):
            return x * scaling

        def bounded(x, by=0.25):
            return x.clamp(LO, HI) - by

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = Norm(1e-6)
                self.gn = nn.GroupNorm(4, 8)
                self.head_dim = 64
                self.scaling = 0.125

            def forward(self, x, y):
                h = self.norm(x) / math.sqrt(self.head_dim)
                h = 3 * h + EPS + 2.0 * pi
                h = scaled(h, self.scaling)
                gain = self.scaling * 3

                def gained(t):
                    return t * gain

                h = bounded(gained(h))
                return h, self.gn(y)
        """
    )
    t = _trace(path, "M", [InputSpec([2, 8]), InputSpec([2, 8, 4])])
    assert _numbers(t.graph) == [
        ("add", "self.eps", ["self.eps", "self.norm.eps"]),  # in the norm, and as the block reaches it
        ("div", "math.sqrt(self.head_dim)", ["math.sqrt(self.head_dim)"]),
        ("add", "EPS", ["EPS"]),  # a global of the module, which code may change after the model is built
        ("mul", "scaling", ["scaling", "self.scaling"]),  # the argument, and what the caller passed
        ("mul", "gain", ["gain", "gain"]),  # a free variable, and the method's own that it is
        ("clamp", "LO", ["LO", "LO"]),  # a global, in the function and in the method of the same module
        ("clamp", "HI", ["HI", "HI"]),
        ("sub", "by", ["bounded.__defaults__[0]", "by"]),  # an argument left at its default, as the caller reaches it
        ("group_norm", "self.num_groups", ["self.gn.num_groups"]),  # torch's own module
        ("group_norm", "self.eps", ["self.gn.eps"]),
    ]  # `3 * h`, `2.0 * pi`, `pow(2)`, `mean(-1)`, `2.0`: literals and constants of libraries stay in the kernel


def test_a_global_of_another_module_is_reached_through_the_module(write_model):
    """A helper in another file of the model's reads its module's global: the caller, which imports
    that module, reaches it as the module's attribute; a library's constant (`math`) is the caller's own."""
    write_model(
        """
        import math
        import torch

        EPS = 1e-5

        def norm(x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * math.sqrt(EPS)
        """,
        "norms.py",
    )
    path = write_model(
        """
        import math
        import torch.nn as nn

        import norms

        class M(nn.Module):
            def forward(self, x):
                return norms.norm(x) + 1.0
        """
    )
    t = _trace(path, "M", [InputSpec([2, 8])])
    assert _numbers(t.graph) == [
        ("add", "EPS", ["EPS", "norms.EPS"]),
        ("mul", "math.sqrt(EPS)", ["math.sqrt(EPS)", "math.sqrt(norms.EPS)"]),
    ]


def test_a_cluster_with_named_numbers_replays_as_one_compiled_graph(write_model):
    """Validation times torch.compile on the cluster's recorded calls: the named numbers reach it as
    plain constants, so the comparison is against one fused graph, not a graph broken at `self.eps`."""
    from fuselens.analysis.detect import detect
    from fuselens.codegen.plan import check, plan_cluster
    from fuselens.validate.replay import cluster_function

    path = write_model(
        """
        import torch
        import torch.nn as nn

        class Norm(nn.Module):
            def __init__(self):
                super().__init__()
                self.eps = 1e-6

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        """
    )
    t = _trace(path, "Norm", [InputSpec([4, 32])])
    (group,) = detect(t.graph, check).clusters
    plan = plan_cluster(t.graph, group.members)
    assert [s.text for s in plan.scalars] == ["self.eps"]
    run = cluster_function(t.graph, plan, {})
    x = torch.randn(4, 32)
    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="eager")  # fullgraph: a graph break raises
    assert torch.allclose(compiled(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch._dynamo.reset()
