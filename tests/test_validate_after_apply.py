"""Validation of a file that is already partly applied: the whole-model check builds its copy with the
kernels the file imports, as `apply` would merge into the module beside it."""

from __future__ import annotations

import os
import shutil

from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.pipeline.apply import apply_file
from fuselens.pipeline.validate import validate_file

from conftest import EXAMPLES


def test_validating_a_partly_applied_file_checks_the_rest_as_a_whole(tmp_path):
    path = tmp_path / "example_net.py"
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), path)
    options = AnalyzeOptions(input_shapes=["64,1024"])
    applied = apply_file(str(path), options, ["c0"], lambda r: True)
    assert applied.applied == ["c0"] and "cluster0" in path.read_text()

    result = validate_file(str(path), options, ValidateOptions(interpret=True))
    (model,) = result.models
    assert [c.status for c in model.clusters] == ["verified", "verified"]
    check = model.model
    assert check is not None and check.applied == ["c1", "c2"]
    assert check.status == "matches", check.message
    assert check.training is not None and check.training.status == "matches", check.training.message
