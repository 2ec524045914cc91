"""The kernel modules fuselens generates, byte for byte (`tests/golden/`).

For every example in examples/ (in eval mode, and in training mode where that changes its clusters),
for a set of the code generator's test cases (`tests/golden/models/`, each model as the test that it
comes from writes it, chosen so that together they run every line of the planner, the emitter and the
launcher that the whole codegen suite runs) and for a library patch, the module `fuselens apply` would
write is generated again and compared with the one recorded.  A change to the generated code shows
here as a diff; where it is meant, `FUSELENS_UPDATE_GOLDEN=1 pytest tests/test_codegen_golden.py`
records the new modules (and removes recorded ones no case makes any more), to be read in the diff.

Every model is analyzed in a folder of its own, as the codegen tests analyze it (its name in the
module's header and docstrings is the file's name, never its folder).  One thing is normalised: what
a library patch records of the library function's compiled code (`made_for`, `calls`: the Python
version, digests of its bytecode, constants and names), which differs from one Python to another.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from fuselens.codegen.module import module_for_report
from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline.analyze import analyze_file

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
MODELS = GOLDEN / "models"
UPDATE = os.environ.get("FUSELENS_UPDATE_GOLDEN") == "1"

EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.py"))

# Each case's model (`tests/golden/models/<case>.py`) and its inputs (shape, dtype), as the test it comes
# from analyzes it.
CASES: dict[str, list[tuple[str, str]]] = {
    # tests/test_codegen_coverage.py: its lowering cases, and the sources of its layout tests (rope-*).
    "activations-with-params": [("33,100", "float32")],
    "batch-norm-1d": [("33,100", "float32"), ("3,16,50", "float32")],
    "batch-norm-batch-statistics": [("2,8,5,7", "float32"), ("5,16", "float32")],
    "casts": [("33,100", "float32")],
    "cross-entropy-ignored-targets-and-wide-rows": [("5,9001", "bfloat16"), ("5", "int64")],
    "division-modes-remainder-fmod": [("33,100", "float32"), ("33,100", "float32")],
    "embeddings-positions-and-norm": [("3,33", "int64")],
    "fp16-softmax": [("3,40,40", "float16")],
    "int-arithmetic-to-float": [("33,100", "int64"), ("33,100", "float32")],
    "log-softmax": [("33,1000", "float32"), ("2,33,33", "float32")],
    "log-softmax-gather-loss": [("33,777", "bfloat16"), ("33", "int64")],
    "logsumexp-norm": [("33,777", "float32")],
    "max-min-lerp-addcmul": [("33,100", "float32"), ("33,100", "float32"), ("33,100", "float32")],
    "nan-propagation": [("33,100", "float32"), ("33,100", "float32")],
    "ops-without-lowering-rejected": [("33,100", "float32"), ("33,100", "float32")],
    "pow": [("33,100", "float32"), ("33,100", "float32")],
    "predicates-nan-to-num": [("33,100", "float32")],
    "reductions-without-lowering-rejected": [("33,100", "float32"), ("33,100", "int64")],
    "rmsnorm-functional": [("3,1000", "float32")],
    "rope-heads-of-an-odd-width-from-a-fused-projection": [
        ("2,4,8,24", "float32"),
        ("8,24", "float32"),
        ("8,24", "float32"),
    ],
    "rope-over-a-transposed-q": [("2,4,8,32", "float32"), ("8,32", "float32"), ("8,32", "float32")],
    "scalar-operands": [("33,100", "float32"), ("33,100", "float32")],
    "slice-select-expand-inside-cluster": [("3,1000", "float32")],
    "views-inside-cluster": [("2,3,5,7", "float32"), ("2,7,3", "float32")],
    "where-masked-fill-compare-logical": [("33,100", "float32"), ("33,100", "float32")],
    "wide-rows-far-from-zero": [("3,10000", "float32"), ("2,8,40,64", "float32")],
    "wide-rows-looped": [("3,10000", "float32")],
    # tests/test_axis_reductions.py: reductions over leading dims, pools, instance norms, views between ops.
    "a-view-between-two-ops": [("6,32", "float32"), ("3,4,5", "float32")],
    "instance-norm-and-batch-statistics": [("2,8,5,7", "float32"), ("3,8,4,6", "float32")],
    "pooling-windows-and-spatial-means": [("2,4,9,11", "float32")],
    # tests/test_training.py: clusters whose backward kernels differ.
    "bounded-periodic-and-log-activations": [("4,33", "float32"), ("4,33", "float32")],
    "embeddings-moved-to-the-model-s-device-then-normalised": [("3,16", "int64"), ("16", "int64")],
    "in-place-scale-and-add-into-the-input": [("5,33", "float32")],
}

# A library patch's record of the code it was made for: the Python version and digests of its code
# objects, which another Python compiles otherwise (the digest of its source text stays).
_COMPILED = re.compile(r"'(python|bytecode|constants|names)': '[^']*'")


def _recorded(golden: Path, text: str) -> None:
    """`text` is the recorded `golden`, byte for byte (or, under FUSELENS_UPDATE_GOLDEN=1, becomes it)."""
    made = text.encode("utf-8")
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        if not golden.exists() or golden.read_bytes() != made:
            golden.write_bytes(made)
        return
    assert golden.exists(), f"no {golden.relative_to(REPO)}: FUSELENS_UPDATE_GOLDEN=1 records it"
    recorded = golden.read_bytes()
    if recorded != made:
        diff = difflib.unified_diff(
            recorded.decode("utf-8").splitlines(keepends=True),
            text.splitlines(keepends=True),
            str(golden.relative_to(REPO)),
            "generated now",
        )
        shown = "".join(list(diff)[:80])
        pytest.fail(
            f"the generated module differs from {golden.relative_to(REPO)} (FUSELENS_UPDATE_GOLDEN=1 records "
            f"it, if the change is meant):\n{shown}",
            pytrace=False,
        )


def _kernel_module(path: Path, options: AnalyzeOptions, patched: bool = False) -> str:
    """The kernel module `fuselens apply` writes for the file at `path` (with every library patch, `patched`)."""
    report = analyze_file(str(path), options)
    assert not report.problems, report.problems
    assert all(m.status in ("analyzed", "skipped") for m in report.models), [m.problem for m in report.models]
    patches = [c.id for _, c in report.clusters() if c.patch is not None] if patched else None
    return module_for_report(report, patched=patches)


def _example_copy(name: str, folder: Path) -> Path:
    """The example in a folder of its own, with the settings examples/pyproject.toml gives it (and no
    kernel module of an earlier `fuselens apply` beside it)."""
    shutil.copy(REPO / "examples" / "pyproject.toml", folder / "pyproject.toml")
    return Path(shutil.copy(REPO / "examples" / name, folder / name))


@pytest.mark.parametrize("name", EXAMPLES)
def test_an_examples_kernel_module_is_the_recorded_one(name, tmp_path):
    path = _example_copy(name, tmp_path)
    _recorded(GOLDEN / "examples" / f"{path.stem}.kernels.py", _kernel_module(path, AnalyzeOptions()))


@pytest.mark.parametrize("name", EXAMPLES)
def test_an_examples_kernel_module_in_training_is_the_recorded_one(name, tmp_path):
    """Training mode (`analyze --train`) leaves dropout and batch statistics out of the clusters: where
    that changes an example's kernel module, its training module is recorded too."""
    path = _example_copy(name, tmp_path)
    trained = _kernel_module(path, AnalyzeOptions(train=True))
    golden = GOLDEN / "examples" / f"{path.stem}.train.kernels.py"
    if trained != _kernel_module(path, AnalyzeOptions()):
        _recorded(golden, trained)
    elif UPDATE:
        golden.unlink(missing_ok=True)
    else:
        assert not golden.exists(), f"{golden.relative_to(REPO)} is the eval module now: FUSELENS_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_codegen_cases_kernel_module_is_the_recorded_one(name, tmp_path):
    inputs = CASES[name]
    path = Path(shutil.copy(MODELS / f"{name}.py", tmp_path / "model.py"))
    options = AnalyzeOptions(input_shapes=[s for s, _ in inputs], dtypes=[d for _, d in inputs])
    _recorded(GOLDEN / "cases" / f"{name}.kernels.py", _kernel_module(path, options))


def test_a_library_patch_kernel_module_is_the_recorded_one(tmp_path):
    """A model built from a package on the path (not the user's code), whose cluster is applied as a
    patch of the package's function: the kernel module carries the patched copy and `install()`."""
    shutil.copytree(MODELS / "library-patch" / "goldennorm", tmp_path / "vendored" / "goldennorm")
    (tmp_path / "project").mkdir()
    path = Path(shutil.copy(MODELS / "library-patch" / "user.py", tmp_path / "project" / "user.py"))
    sys.path.insert(0, str(tmp_path / "vendored"))
    try:
        text = _kernel_module(path, AnalyzeOptions(), patched=True)
    finally:
        sys.path.remove(str(tmp_path / "vendored"))
        for module in [m for m in sys.modules if m == "goldennorm" or m.startswith("goldennorm.")]:
            del sys.modules[module]
    assert "_library_patch(" in text
    _recorded(GOLDEN / "library" / "user.kernels.py", _COMPILED.sub(r"'\1': '<as this Python compiles it>'", text))


def test_every_recorded_module_has_its_case():
    """A recorded module no case makes any more is not left to look checked."""
    expected = {f"examples/{Path(n).stem}.kernels.py" for n in EXAMPLES}
    expected |= {f"examples/{Path(n).stem}.train.kernels.py" for n in EXAMPLES}  # where training differs
    expected |= {f"cases/{name}.kernels.py" for name in CASES} | {"library/user.kernels.py"}
    recorded = {str(p.relative_to(GOLDEN)) for p in GOLDEN.glob("*/*.kernels.py")}
    stale = sorted(recorded - expected)
    if UPDATE:
        for name in stale:
            (GOLDEN / name).unlink()
        return
    assert not stale, f"recorded modules of no case: {stale}"
    models = {p.stem for p in MODELS.glob("*.py")}
    assert models == set(CASES), f"models without a case or cases without a model: {models ^ set(CASES)}"
