"""A module's settings: the plain values of its state that decide what its forward computes.

A kernel stands in for code that may call submodules (`self.act_fn(gate)`, `self.norm(x)`).  It
computes what those modules computed in the analyzed model; another instance of the same code may
hold another module there (a GELU where the analyzed one had a SiLU) or the same class set up
otherwise (another `approximate`, another momentum), and the kernel must not run for it.  A call
therefore compares each such module's class and settings with those it was made for.

`module_settings` and `class_identity` are written once, here, without module-level imports: the
analysis records with them, and every generated kernel module carries their text
(`codegen/admission.py`), so that the values recorded and the values compared at run time are made
the same way.
"""

from __future__ import annotations

from typing import Any


def module_settings(module: Any) -> dict[str, Any]:
    """The plain values among `module`'s own attributes (numbers, strings, flags, None, tuples of
    them, and functions or classes by name): what a module's code may branch on or compute with,
    besides its tensors and submodules.  Private names and `training` are left out (the mode is
    checked on its own, where the code depends on it), and so are the sizes of torch's modules."""
    # The sizes torch's own modules keep besides their weights: a call's shapes are checked on their own.
    sizes = {"num_embeddings", "embedding_dim", "in_features", "out_features", "normalized_shape", "num_features"}
    sizes |= {"num_channels", "in_channels", "out_channels"}
    settings = {}
    for name, value in vars(module).items():
        if name.startswith("_") or name == "training" or name in sizes:
            continue
        kept = setting_value(value)
        if kept is not None or value is None:
            settings[name] = kept
    return settings


def setting_value(value: Any) -> Any:
    """`value` as a setting compares and prints (a literal Python reads back), or None when it is not
    a setting (a tensor, a configuration object, a module)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else f"float:{value!r}"
    if isinstance(value, (tuple, list)):
        items = [setting_value(v) for v in value]
        if all(kept is not None or v is None for kept, v in zip(items, value, strict=True)):
            return tuple(items)
        return None
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        return f"dtype:{value}"
    if isinstance(value, type) or type(value).__name__ in ("function", "builtin_function_or_method"):
        return f"callable:{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"
    return None


def class_identity(cls: type) -> str:
    """`modeling_qwen3.py:Qwen3RMSNorm`: a class by the file that defines it and its qualified name.  The
    module's name would not do: the analysis imports the user's file under a name of its own, and the
    user's program as `__main__`, `model` or `pkg.model`."""
    import os
    import sys

    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    for value in () if file else vars(cls).values():  # a module loaded without a place in sys.modules
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        if code is not None:
            file = code.co_filename
            break
    return f"{os.path.basename(file or cls.__module__)}:{cls.__qualname__}"
