"""Dynamic shapes: sizes declared as named ranges, answered as expressions and at each size of a corpus.

Declarations are read from every place a model's inputs can be given (pyproject.toml, the class-line
comment, the editor's settings, `--dim`); the analysis runs at one binding and adds expressions of the
declared sizes, the guards the model puts on them, and per-size rows.
"""

from __future__ import annotations

import pytest

from fuselens.analysis.config import Source, resolve
from fuselens.contracts.config import ConfigError, from_comment, model_settings
from fuselens.contracts.dims import default_corpus


def _resolved(entry: dict, where: str = "pyproject.toml [tool.fuselens.models.Block]"):
    return resolve([Source(where, model_settings(entry, where))])


# ---- declarations ------------------------------------------------------------------------------


def test_pyproject_table_binds_the_inputs_at_the_middle_of_each_corpus():
    config = _resolved(
        {
            "inputs": [["batch", "seq", 4096]],
            "dims": {"batch": {"min": 1, "max": 64}, "seq": {"min": 1, "max": 8192, "corpus": [1, 128, 2048, 8192]}},
        }
    )
    (spec,) = config.inputs
    assert spec.symbols == ["batch", "seq", None]
    assert spec.shape == [config.dims["batch"].binding, 2048, 4096]
    assert config.dims["seq"].corpus == [1, 128, 2048, 8192]
    assert config.dims["batch"].corpus == default_corpus(1, 64) == [1, 2, 8, 32, 64]


def test_comment_declares_inputs_and_dims_in_one_line():
    settings = from_comment(
        "class Block(nn.Module):  # fuselens: input=(4, seq, 1024) bfloat16 dims=seq:1..8192@1,128,2048,8192",
        "the inline comment on line 3",
    )
    assert settings is not None and settings.inputs is not None
    assert settings.inputs[0].dtype == "bfloat16"
    assert settings.inputs[0].symbols == [None, "seq", None]
    assert settings.dims["seq"].corpus == [1, 128, 2048, 8192]


def test_several_dims_in_a_comment_are_separated_by_semicolons():
    settings = from_comment("# fuselens: input=(batch, seq) dims=batch:1..64;seq:1..4096", "c")
    assert settings is not None
    assert sorted(settings.dims) == ["batch", "seq"]
    assert settings.dims["seq"].corpus == default_corpus(1, 4096)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"inputs": [["seq", 64]], "dims": {"sq": {"min": 1, "max": 8}}}, "unknown symbol 'sq'"),
        ({"inputs": [["seq", 64]], "dims": {"seq": {"min": 9, "max": 8}}}, "seq has min 9 > max 8"),
        (
            {"inputs": [["seq", 64]], "dims": {"seq": {"min": 1, "max": 8, "corpus": [1, 16]}}},
            "seq.corpus has 16 outside its range 1..8",
        ),
        ({"inputs": [["seq", 64]]}, "names 'seq', whose range is not declared"),
        ({"inputs": [["seq", 64]], "dims": {"seq": {"min": 0, "max": 8}}}, "seq.min must be a positive integer"),
        ({"inputs": [["seq", 64]], "dims": {"seq": {"min": 1, "max": 8, "step": 2}}}, "unknown key 'step'"),
    ],
)
def test_bad_declarations_say_what_is_wrong_and_where(entry, message):
    with pytest.raises(ConfigError) as caught:
        _resolved(entry)
    assert message in str(caught.value)
    assert "pyproject.toml" in str(caught.value)


def test_dims_declared_for_other_inputs_than_those_analyzed_are_left_aside():
    table = Source(
        "pyproject.toml", model_settings({"inputs": [["seq", 64]], "dims": {"seq": {"min": 1, "max": 8}}}, "p")
    )
    cli = Source("--input-shape", model_settings({"inputs": [[4, 64]]}, "--input-shape"))
    config = resolve([cli, table])
    assert config.inputs is not None and config.inputs[0].shape == [4, 64]
    assert config.dims == {}
