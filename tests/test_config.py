"""A model's configuration: which source wins, for every source and every combination of them,
and analysis and validation building the same model from it."""

from __future__ import annotations

import itertools

import pytest

from fuselens.analysis.config import ModelClass, resolve_model
from fuselens.contracts.config import ConfigError, InputSpec, model_settings
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions

PYPROJECT = "/project/pyproject.toml"
PYPROJECT_WHERE = "pyproject.toml [tool.fuselens.models.Net]"
COMMENT_WHERE = "the inline comment on line 3"
NET = ModelClass("Net", 3, "class Net(nn.Module):", outermost=True)

# Every source of inputs, highest precedence first, each giving a shape of its own.
INPUT_SOURCES = ["cli", "editor", "pyproject", "comment", "example_inputs"]
SHAPE = {"cli": [1, 1], "editor": [2, 2], "pyproject": [3, 3], "comment": [4, 4], "example_inputs": [5, 5]}
WHERE = {
    "cli": "--input-shape",
    "editor": "editor settings",
    "pyproject": PYPROJECT_WHERE,
    "comment": COMMENT_WHERE,
    "example_inputs": "Net.example_inputs()",
}


class Calls:
    """An example_inputs() provider that counts its calls (it is user code: called only when needed)."""

    def __init__(self, given: bool):
        self.given, self.count = given, 0

    def __call__(self):
        self.count += 1
        return ([InputSpec(SHAPE["example_inputs"])], WHERE["example_inputs"]) if self.given else None


def configure(
    present: set[str],
    entry: dict | None = None,
    comment: str = "",
    options: dict | None = None,
    model: ModelClass = NET,
):
    """Resolve Net's configuration with the sources in `present` each giving its own inputs."""

    def shape_text(name):
        return ", ".join(map(str, SHAPE[name]))

    editor = {"inputs": [SHAPE["editor"]], **(entry or {})} if "editor" in present else dict(entry or {})
    pyproject = {"inputs": [SHAPE["pyproject"]]} if "pyproject" in present else {}
    header = model.header + (
        f"  # fuselens: input=({shape_text('comment')}) {comment}"
        if "comment" in present
        else (f"  # fuselens: {comment}" if comment else "")
    )
    opts = AnalyzeOptions(
        input_shapes=[shape_text("cli").replace(" ", "")] if "cli" in present else None,
        models={"Net": model_settings(editor, "models.Net")} if editor else {},
        **(options or {}),
    )
    table = {"models": {"Net": pyproject}} if pyproject else {}
    calls = Calls("example_inputs" in present)
    config = resolve_model(ModelClass(model.name, model.line, header, model.outermost), opts, table, PYPROJECT, calls)
    return config, calls


@pytest.mark.parametrize(
    "present",
    [set(c) for n in range(len(INPUT_SOURCES) + 1) for c in itertools.combinations(INPUT_SOURCES, n)],
    ids=lambda p: "+".join(sorted(p)) or "none",
)
def test_inputs_come_whole_from_the_highest_source_that_gives_them(present):
    config, calls = configure(present)
    winner = next((s for s in INPUT_SOURCES if s in present), None)
    if winner is None:
        assert config.inputs is None and config.inputs_source == ""
    else:
        assert [s.shape for s in config.inputs] == [SHAPE[winner]]
        assert config.inputs_source == WHERE[winner]
    assert calls.count == (1 if winner in ("example_inputs", None) else 0)  # user code runs only when needed


INIT_SOURCES = ["editor", "pyproject", "comment"]


@pytest.mark.parametrize(
    "present",
    [set(c) for n in range(len(INIT_SOURCES) + 1) for c in itertools.combinations(INIT_SOURCES, n)],
    ids=lambda p: "+".join(sorted(p)) or "none",
)
def test_constructor_arguments_merge_key_by_key_the_highest_source_winning(present):
    editor = {"init": {"dim": 1, "only_editor": True}} if "editor" in present else {}
    opts = AnalyzeOptions(models={"Net": model_settings(editor, "models.Net")} if editor else {})
    table = {"models": {"Net": {"init": {"dim": 2, "only_pyproject": True}}}} if "pyproject" in present else {}
    header = NET.header + ("  # fuselens: init=(dim=3, only_comment=True)" if "comment" in present else "")
    config = resolve_model(ModelClass("Net", 3, header, True), opts, table, PYPROJECT)
    dims = {"editor": 1, "pyproject": 2, "comment": 3}
    where = {"editor": "editor settings", "pyproject": PYPROJECT_WHERE, "comment": COMMENT_WHERE}
    winner = next((s for s in INIT_SOURCES if s in present), None)
    expected = {f"only_{s}": True for s in present} | ({"dim": dims[winner]} if winner else {})
    assert config.init == expected
    assert config.init_sources == {f"only_{s}": where[s] for s in present} | ({"dim": where[winner]} if winner else {})


PARAM_SOURCES = ["cli", "editor", "pyproject"]


@pytest.mark.parametrize(
    "present",
    [set(c) for n in range(len(PARAM_SOURCES) + 1) for c in itertools.combinations(PARAM_SOURCES, n)],
    ids=lambda p: "+".join(sorted(p)) or "none",
)
def test_the_weight_dtype_comes_from_the_highest_source_that_gives_one(present):
    dtype = {"cli": "bfloat16", "editor": "float16", "pyproject": "float64"}
    opts = AnalyzeOptions(
        param_dtype=dtype["cli"] if "cli" in present else None,
        models={"Net": model_settings({"param_dtype": dtype["editor"]}, "models.Net")} if "editor" in present else {},
    )
    table = {"models": {"Net": {"param_dtype": dtype["pyproject"]}}} if "pyproject" in present else {}
    config = resolve_model(NET, opts, table, PYPROJECT)
    winner = next((s for s in PARAM_SOURCES if s in present), None)
    assert config.param_dtype == (dtype[winner] if winner else None)
    assert (
        config.param_dtype_source
        == {"cli": "--param-dtype", "editor": "editor settings", "pyproject": PYPROJECT_WHERE, None: ""}[winner]
    )


def test_command_line_inputs_are_for_the_named_class_or_the_outermost_ones():
    inner = ModelClass("Inner", 3, "class Inner(nn.Module):", outermost=False)
    config, _ = configure({"cli", "comment"}, model=inner)  # not outermost: its own comment wins
    assert config.inputs_source == COMMENT_WHERE
    config, _ = configure({"cli", "comment"}, model=inner, options={"model_class": "Inner"})
    assert config.inputs_source == "--input-shape"
    config, _ = configure({"cli", "comment"}, options={"model_class": "Inner"})  # Net is not the named class
    assert config.inputs_source == COMMENT_WHERE


def test_dtype_alone_retypes_the_inputs_another_source_gave():
    config, _ = configure({"pyproject"}, options={"dtypes": ["int64"]})
    assert [(s.shape, s.dtype) for s in config.inputs] == [(SHAPE["pyproject"], "int64")]
    assert config.inputs_source == f"{PYPROJECT_WHERE} with --dtype"


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"inputs": [[2, 2]], "input": [[3]]}, "unknown key 'input'"),
        ({"inputs": "big"}, "models.Net.inputs must be a list of shapes"),
        ({"dtype": "bfloat16"}, "the dtype of `inputs`, which are not given"),
        ({"inputs": [[2]], "param_dtype": "float33"}, "unknown dtype 'float33'"),
        ({"inputs": [[2]], "init": [1, 2]}, "init must be a table"),
        ({"inputs": [{"shape": [2], "high": 100}]}, "high bounds an integer input's values"),
        ({"inputs": [{"shape": [2], "dtype": "int64", "high": 0}]}, "high must be a positive integer"),
        ({"inputs": [{"shape": [2], "dtype": "int64", "hi": 5}]}, "unknown key 'hi'"),
    ],
)
def test_a_malformed_entry_is_named_not_half_read(entry, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        model_settings(entry, "models.Net")


MODEL = """
import torch, torch.nn as nn

class Net(nn.Module):  # fuselens: input=(32, 64) init=(dim=64, heads=4)
    def __init__(self, dim: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.proj(x)
        if self.heads == 4:
            return torch.relu(h) * 2 + 1
        return torch.sigmoid(h) - 1
"""


def test_analysis_and_validation_build_the_same_model(write_model, tmp_path):
    """The comment says init=(dim=64, heads=4) and the pyproject dim = 64 again: both build
    Net(dim=64, heads=4), so the cluster analysis found is the one validation runs."""
    from fuselens.pipeline.analyze import analyze
    from fuselens.pipeline.validate import validate_file

    (tmp_path / "pyproject.toml").write_text("[tool.fuselens.models.Net]\ninit = { dim = 64 }\n")
    path = write_model(MODEL)
    analyzed = analyze(path)
    assert analyzed.configs["Net"].init == {"dim": 64, "heads": 4}
    (model,) = analyzed.report.models
    assert [c.op_chain for c in model.clusters] == ["relu → mul → add"]
    result = validate_file(path, AnalyzeOptions(), ValidateOptions(interpret=True))
    assert [c.status for m in result.models for c in m.clusters] == ["verified"], result.to_dict()


EMBEDDING = """
import torch, torch.nn as nn

class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(1000, 8)

    def forward(self, ids):
        return torch.relu(self.table(ids)) * 2
"""


def test_token_ids_span_the_vocabulary_the_settings_give(write_model, tmp_path):
    """`high` bounds an integer input's values: the report carries it, so validation draws ids from
    the whole vocabulary (lookups that read rows all over the table), not from [0, 16)."""
    from fuselens.analysis.loader import random_inputs
    from fuselens.pipeline.analyze import analyze

    (tmp_path / "pyproject.toml").write_text(
        '[tool.fuselens.models.Lookup]\ninputs = [{ shape = [4096], dtype = "int64", high = 1000 }]\n'
    )
    path = write_model(EMBEDDING)
    (model,) = analyze(path).report.models
    assert (model.inputs[0].dtype, model.inputs[0].high) == ("int64", 1000)
    assert "in [0, 1000)" in InputSpec([4096], "int64", high=1000).describe()
    (ids,) = random_inputs([InputSpec([4096], "int64", high=model.inputs[0].high)], "cpu", seed=0)
    assert int(ids.min()) >= 0 and int(ids.max()) < 1000 and len(ids.unique()) > 900
    (small,) = random_inputs([InputSpec([4096], "int64")], "cpu", seed=0)
    assert int(small.max()) < 16
    from fuselens.pipeline.validate import validate_file

    result = validate_file(path, AnalyzeOptions(), ValidateOptions(interpret=True))
    assert [c.status for m in result.models for c in m.clusters] == ["verified"], result.to_dict()
