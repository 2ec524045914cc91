"""Where example inputs and constructor arguments come from, and what happens without them."""

from __future__ import annotations

import pytest

from fuselens.contracts.config import ConfigError, from_cli, from_comment

from conftest import only_model

MODEL = """
import torch, torch.nn as nn

class Net(nn.Module):{comment}
    def __init__(self, width: int = 8):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.proj(x)) * 2
{extra}
"""


def write(write_model, tmp_path, comment="", extra="", pyproject=None):
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    return write_model(MODEL.format(comment=comment, extra=extra))


def test_inline_comment(write_model, tmp_path, analyze):
    path = write(write_model, tmp_path, comment="  # fuselens: input=(32, 8) float16")
    model = only_model(analyze(path))
    assert [(i.shape, i.dtype) for i in model.inputs] == [([32, 8], "float16")]
    assert "inline comment" in model.inputs_source


def test_pyproject_beats_the_comment_and_the_cli_beats_both(write_model, tmp_path, analyze):
    path = write(
        write_model,
        tmp_path,
        comment="  # fuselens: input=(32, 8) float16",
        pyproject='[tool.fuselens.models.Net]\ninputs = [[64, 8]]\ndtype = "bfloat16"\n',
    )
    model = only_model(analyze(path))
    assert [(i.shape, i.dtype) for i in model.inputs] == [([64, 8], "bfloat16")]
    model = only_model(analyze(path, input_shapes=["16,8"], dtypes=["float32"]))
    assert [(i.shape, i.dtype) for i in model.inputs] == [([16, 8], "float32")]
    assert model.inputs_source == "--input-shape"


def test_example_inputs_classmethod_and_module_function(write_model, tmp_path, analyze):
    path = write(
        write_model,
        tmp_path,
        extra="    @classmethod\n    def example_inputs(cls):\n        return (torch.randn(1 << 20, 8),)\n",
    )
    model = only_model(analyze(path))
    assert model.inputs[0].shape == [1 << 20, 8]  # built on meta: no 32 MB allocated
    path = write(write_model, tmp_path, extra="def example_inputs():\n    return {'Net': (torch.randn(4, 8),)}\n")
    assert only_model(analyze(path)).inputs[0].shape == [4, 8]


def test_without_inputs_the_model_is_skipped_with_a_hint(write_model, tmp_path, analyze):
    report = analyze(write(write_model, tmp_path))
    (model,) = report.models
    assert model.status == "skipped" and not model.clusters
    assert "input=(" in model.problem.hint and "pyproject.toml" in model.problem.hint


def test_constructor_arguments_are_asked_for_by_name(write_model, tmp_path, analyze):
    path = write_model("""
        import torch, torch.nn as nn

        class Net(nn.Module):  # fuselens: input=(4, 8)
            def __init__(self, width, depth):
                super().__init__()
                self.proj = nn.Linear(width, width)

            def forward(self, x):
                return torch.relu(self.proj(x)) * 2
    """)
    (model,) = analyze(path).models
    assert model.status == "error" and model.problem.kind == "construct"
    assert "width, depth" in model.problem.message and model.problem.line == 3
    assert "init" in model.problem.hint
    path2 = path.replace("model.py", "model2.py")
    with open(path) as src, open(path2, "w") as dst:
        dst.write(src.read().replace("input=(4, 8)", "input=(4, 8) init=(width=8, depth=2)"))
    assert only_model(analyze(path2)).clusters


def test_models_are_put_in_eval_mode(write_model, tmp_path, analyze):
    path = write_model("""
        import torch, torch.nn as nn

        class Net(nn.Module):  # fuselens: input=(4, 8)
            def __init__(self):
                super().__init__()
                self.drop = nn.Dropout(0.5)

            def forward(self, x):
                return self.drop(torch.relu(x)) * 2
    """)
    model = only_model(analyze(path))
    assert [c.op_chain for c in model.clusters] == ["relu → mul"]  # dropout is the identity


@pytest.mark.parametrize(
    "text, message",
    [
        ("# fuselens: input=(4, 2.5) float32", "must be integers like 16384,1024, or name a dynamic size"),
        ("# fuselens: input=(4, 8) float33", "unknown dtype 'float33'"),
        ("# fuselens: init=(width=open('f'))", "must be a literal"),
        ("# fuselens: input=(8, 64), (8, 64) float32", "float32` has no `input=`"),
    ],
)
def test_malformed_inline_specs_name_the_problem(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        from_comment(text, "line 3")


def test_cli_shapes_and_dtypes():
    specs = from_cli(["2,128", "2,128"], ["int64", "bool"])
    assert [(s.shape, s.dtype) for s in specs] == [([2, 128], "int64"), ([2, 128], "bool")]
    with pytest.raises(ConfigError, match="one per --input-shape"):
        from_cli(["2", "3", "4"], ["float32", "int64"])


def test_bad_pyproject_entry_names_the_key(write_model, tmp_path, analyze):
    path = write(write_model, tmp_path, pyproject='[tool.fuselens.models.Net]\ninputs = "big"\n')
    (model,) = analyze(path).models
    assert model.status == "error"
    assert "[tool.fuselens.models.Net].inputs" in model.problem.message
