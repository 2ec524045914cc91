"""The commands the language server answers (`workspace/executeCommand`), by the ids editors call them with.

Defined here once: the server registers these and puts them in its lenses and code actions; the editor
plugins, in their own languages, spell the same ids, and `tests/test_contract_definitions.py` checks
that each id they send is one of these.
"""

from __future__ import annotations

ANALYZE = "fuselens.analyze"
VALIDATE_KERNEL = "fuselens.validateKernel"
VALIDATE_ALL = "fuselens.validateAll"
PROFILE = "fuselens.profile"
PROBE = "fuselens.probe"  # run the models on data and sketch each GEMM site (`fuselens probe`)
VALIDATION_RESULTS = "fuselens.validationResults"  # the results view of a file's last validation
SHOW_KERNEL = "fuselens.showKernel"
SHOW_INDUCTOR_KERNEL = "fuselens.showInductorKernel"
WRITE_KERNEL_MODULE = "fuselens.writeKernelModule"  # the second half of a quick fix: the kernel module on disk

SERVER_COMMANDS = (
    ANALYZE,
    VALIDATE_KERNEL,
    VALIDATE_ALL,
    PROFILE,
    PROBE,
    VALIDATION_RESULTS,
    SHOW_KERNEL,
    SHOW_INDUCTOR_KERNEL,
    WRITE_KERNEL_MODULE,
)
