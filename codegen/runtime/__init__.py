"""Python that runs inside the generated kernel module: real modules here (linted, type-checked and
unit-tested as they are), carried by every kernel module as a copy of their text
(`codegen/runtime_source.py`), so that the kernel module imports nothing of fuselens.

Nothing here is imported where kernel modules are assembled (the language server never loads
torch): they are read as text."""
