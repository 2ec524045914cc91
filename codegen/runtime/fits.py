"""What a kernel's `fits` asks at run time (`codegen/admission.py` writes each kernel's): the
tensors' ranks, the numbers' kinds, whether gradients are wanted, and whether the modules the
replaced lines call are those the kernel was made for, compared by the analysis's own
`module_settings` and `class_identity`, whose text the kernel module carries after this module's."""

import torch

from fuselens.analysis.settings import class_identity, module_settings

# ---- the kernel module's copy starts here


def _tensors_of_ranks(tensors, ranks):
    """Whether each of `tensors` is a tensor of its rank in `ranks`."""
    return all([isinstance(t, torch.Tensor) and t.dim() == r for t, r in zip(tensors, ranks)])


def _numbers_fit(numbers, kinds):
    """Whether each of `numbers` is a plain number of its kind ("float" takes an int too), as the kernel takes it."""
    for value, kind in zip(numbers, kinds):
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind == "float" else int):
            return False
    return True


def _no_gradients(tensors):
    """Whether no gradient is wanted of these tensors, so that only the forward kernel runs."""
    return not torch.is_grad_enabled() or not any([t.requires_grad for t in tensors])


def _modules_match(module, checks):
    """Whether the modules the replaced lines call, reached from `module` (their function's `self`), are
    those the kernel was made for: each (path, class, settings, settings passed, mode) of `checks` holds (a
    setting the call passes the kernel as a number may have any value)."""
    if module is None:
        return False
    for path, type_name, settings, passed, mode in checks:
        found = module
        for part in path.split(".") if path else ():
            found = getattr(found, part, None)
            if found is None:
                return False
        if type_name and class_identity(type(found)) != type_name:
            return False
        if mode is not None and getattr(found, "training", None) is not mode:
            return False
        if type_name and {k: v for k, v in module_settings(found).items() if k not in passed} != settings:
            return False
    return True


def _made_match(made, checks):
    """Whether the modules the lines made where they call them (`made`, as the call asked each expression
    again) are of the class and settings of each of `checks`, in turn."""
    if len(made) != len(checks):
        return False
    for found, (_, type_name, settings, passed, _mode) in zip(made, checks):
        if class_identity(type(found)) != type_name:
            return False
        if {k: v for k, v in module_settings(found).items() if k not in passed} != settings:
            return False
    return True
