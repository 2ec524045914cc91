"""Load the user's file and build its models: the only place user code is imported.

Every call imports the file afresh under a unique module name, so an edit is always
seen (the worker forks per job, so nothing leaks between jobs).  Models are built on
the meta device, so constructing a 48-layer GPT allocates nothing; code that needs real
values while constructing falls back to a CPU build.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import inspect
import linecache
import os
import sys
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from fuselens.contracts.config import InputSpec

from .capture import UserCode, user_frame
from .discover import Candidates
from .graph import Frame
from .normalise import dtype_name
from .weights import all_to_meta, materialise, parameters_on_meta, reproducible, to_meta, weights_on_meta


class LoadError(Exception):
    """Loading or building failed in user code; `frame` is the user's line."""

    def __init__(self, kind: str, message: str, frame: Frame | None = None, hint: str = ""):
        super().__init__(message)
        self.kind = kind
        self.frame = frame
        self.hint = hint


def import_file(path: str, user_code: UserCode, text: str | None = None) -> ModuleType:
    """Execute the file (or `text` as if it were the file) as a fresh module.

    Its directory goes on sys.path so its local imports resolve: the directory of the file itself,
    past any symbolic link, as Python does for a script.  A link's own folder is not the file's: a
    module there named like one the file imports would run in its stead, from a folder nobody
    trusted (trust is decided on the resolved path too).
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(os.path.realpath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    digest = hashlib.sha1(path.encode()).hexdigest()[:10]
    stem = os.path.splitext(os.path.basename(path))[0]
    name = f"fuselens_user_{stem}_{digest}"
    # The file's fuselens kernel module is imported afresh too: one imported earlier may be another
    # folder's of the same name, or this one's before `apply` rewrote it.  (Looked up by name: reading
    # every name in `sys.modules` copies the worker host's pages into the job.)
    for stale in (name, f"{stem}_kernels"):
        sys.modules.pop(stale, None)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError("import", f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        if text is None:
            with tokenize.open(path) as fh:  # as Python reads a source: its BOM or coding cookie, any line end
                text = fh.read()
        # The text may be an editor buffer newer than the disk: make tracebacks quote it.
        linecache.cache[path] = (len(text), None, text.splitlines(keepends=True), path)
        code = compile(text, path, "exec")  # importing the user's module, as `import` would
        # A model built at module level costs nothing, keeps its buffers, and starts from the same values
        # in every analysis.
        with reproducible(), weights_on_meta():
            exec(code, module.__dict__)
    except SyntaxError as exc:
        frame = Frame(exc.filename or path, exc.lineno or 1, "<module>")
        raise LoadError("syntax", f"SyntaxError: {exc.msg}", frame) from exc
    except SystemExit as exc:
        raise LoadError(
            "import",
            f"the module called sys.exit({exc.code!r}) while being imported",
            user_frame(exc, user_code) or Frame(path, 1, "<module>"),
            hint='guard script code with `if __name__ == "__main__":`',
        ) from exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        frame = user_frame(exc, user_code) or Frame(path, 1, "<module>")
        raise LoadError("import", f"importing the file failed: {type(exc).__name__}: {exc}", frame) from exc
    return module


def model_classes(module: ModuleType) -> dict[str, type]:
    return {
        name: obj
        for name, obj in vars(module).items()
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__
    }


@dataclass
class ModelSource:
    """A model of the file: a class to build, or a module-level object that is one already."""

    name: str  # the class's name, or the variable the object is bound to
    line: int  # where it is defined, bound or imported
    header: str  # the text an inline `# fuselens:` comment is read from
    cls: type  # the class (of the object, for one)
    outermost: bool  # no other model of the file uses it (command-line inputs are for these)
    instance: torch.nn.Module | None = None  # the object, for a module-level model (on meta)
    values: dict[str, torch.Tensor] = field(default_factory=dict)  # the object's small real tensors

    @property
    def aliases(self) -> tuple[str, ...]:
        """Other names its settings may be given under: an object's class name."""
        return (self.cls.__name__,) if self.instance is not None else ()


def find_models(
    module: ModuleType, candidates: Candidates, configured: Callable[[str], bool], user_code: UserCode
) -> list[ModelSource]:
    """The models of an imported file, in the order it defines them: its nn.Module classes (also those
    deriving from a library's model class), its module-level model objects whose class it does not
    define, and model classes imported from another of the user's files that are configured here."""
    defined = model_classes(module)
    outermost = candidates.outermost()
    found = [
        ModelSource(c.name, c.line, c.comment, defined[c.name], c.name in outermost)
        for c in candidates.classes
        if c.name in defined
    ]
    values = vars(module)
    for binding in candidates.bindings:
        obj = values.get(binding.name)
        if isinstance(obj, torch.nn.Module) and _has_weights(obj) and type(obj) not in defined.values():
            found.append(ModelSource(binding.name, binding.line, binding.text, type(obj), True, obj, to_meta(obj)))
    for name, line in candidates.imports.items():
        obj = values.get(name)
        if (
            isinstance(obj, type)
            and issubclass(obj, torch.nn.Module)
            and configured(name)
            and user_code(inspect.getsourcefile(obj) or "")
        ):
            found.append(ModelSource(name, line, "", obj, True))
    return found


def _has_weights(model: torch.nn.Module) -> bool:
    """A module-level model has weights: a loss or an activation bound for later use is not one."""
    return next(model.parameters(), None) is not None


@dataclass
class Built:
    model: torch.nn.Module  # every tensor on the meta device
    on_meta: bool
    note: str = ""
    values: dict[str, torch.Tensor] = field(default_factory=dict)  # the small tensors' real values, by name
    # The large buffers made as a triangle of ones (a causal mask), whose values are not kept: "tril"/"triu1".
    triangles: dict[str, str] = field(default_factory=dict)
    # For a model built without values (`build(values=False)`): the build that makes them.
    build_values: Callable[[], dict[str, torch.Tensor]] | None = None

    def real_values(self) -> dict[str, torch.Tensor]:
        """`values`, built now for a model built without them."""
        if self.build_values is not None:
            self.values, self.build_values = self.build_values(), None
        return self.values

    def real(self, seed: int = 0, device: str = "cpu") -> torch.nn.Module:
        """The model with real tensors (a copy): its own values for buffers and small tensors, seeded
        random weights for the rest."""
        return materialise(copy.deepcopy(self.model), self.real_values(), seed, device)


def build_source(
    source: ModelSource, init: dict[str, Any], user_code: UserCode, param_dtype: str | None, values: bool = True
) -> Built:
    """The model `source` names: its class built (see `build`), or its module-level object as it is."""
    if source.instance is None:
        return build(source.cls, init, user_code, hint_for_init(source.name), param_dtype, values)
    model = source.instance.eval()
    if param_dtype:
        model.to(getattr(torch, param_dtype))
    note = "built where it is bound; constructor arguments from settings do not apply to it" if init else ""
    return Built(model, on_meta=True, note=note, values=source.values)


def build(
    cls: type,
    init: dict[str, Any],
    user_code: UserCode,
    init_hint: str = "",
    param_dtype: str | None = None,
    values: bool = True,
) -> Built:
    """Instantiate `cls(**init)` in eval mode, on the meta device when the code allows it, with its
    weights cast to `param_dtype` when one is given.  `values=False` (a model to be traced): its
    parameters are never given values, and `Built.real_values()` builds it again for them."""
    built = None if values else _without_values(cls, init, user_code, init_hint)
    if built is None:
        built = _build(cls, init, user_code, init_hint)
    if param_dtype:
        built.model.to(getattr(torch, param_dtype))
    return built


def _without_values(cls: type, init: dict[str, Any], user_code: UserCode, init_hint: str) -> Built | None:
    """The model with its parameters on meta from the start (`parameters_on_meta`): the model `_build`
    makes, less the values.  None where the constructor cannot run so (it reads a parameter's values,
    or fails anyway): `_build` then builds it, and says why when it cannot either."""
    if _missing_arguments(cls, init):
        return None
    try:
        with reproducible(), weights_on_meta() as made, parameters_on_meta():
            model = cls(**init)
    except (Exception, SystemExit):
        return None
    triangles = made.triangles(model)  # (as `_build` finds them: a mask of ones made from no parameter)
    all_to_meta(model)
    return Built(
        model.eval(),
        on_meta=True,
        triangles=triangles,
        build_values=lambda: _build(cls, init, user_code, init_hint).values,
    )


def _build(cls: type, init: dict[str, Any], user_code: UserCode, init_hint: str) -> Built:
    missing = _missing_arguments(cls, init)
    if missing:
        raise LoadError(
            "construct",
            f"{cls.__name__}(...) needs constructor arguments: {', '.join(missing)}",
            _class_frame(cls),
            hint=init_hint,
        )
    try:
        with reproducible(), weights_on_meta() as made:
            model = cls(**init)
        triangles = made.triangles(model)  # (before to_meta replaces the tensors)
        return Built(model.eval(), on_meta=True, values=to_meta(model), triangles=triangles)
    except SystemExit as exc:
        raise LoadError(
            "construct",
            f"{cls.__name__}() called sys.exit({exc.code!r})",
            user_frame(exc, user_code) or _class_frame(cls),
        ) from exc
    except Exception as meta_exc:
        meta_error = meta_exc
    with contextlib.suppress(Exception):  # a constructor that mixes its small real tensors with meta ones
        with torch.device("meta"):
            model = cls(**init)
        return Built(model.eval(), on_meta=True, note="built on the meta device: buffers have no values")
    try:
        with reproducible():
            model = cls(**init)
        values = to_meta(model)
        return Built(
            model.eval(),
            on_meta=False,
            note=f"built on the CPU: constructing on the meta device failed ({type(meta_error).__name__}: {meta_error})",
            values=values,
        )
    except Exception as exc:
        raise LoadError(
            "construct",
            f"{cls.__name__}() failed: {type(exc).__name__}: {exc}",
            user_frame(exc, user_code) or _class_frame(cls),
        ) from exc


def build_real(cls: type, init: dict[str, Any], seed: int = 0, param_dtype: str | None = None) -> torch.nn.Module:
    """A CPU instance with real (seeded) weights, for numerical validation."""
    torch.manual_seed(seed)
    model = cls(**init).eval()
    return model.to(getattr(torch, param_dtype)) if param_dtype else model


def _missing_arguments(cls: type[Any], init: dict[str, Any]) -> list[str]:
    # `type[Any]`: any class, whose own `__init__` (self first) is read; mypy takes a bare `type`
    # for an instance of `type`, whose `__init__` would be the metaclass's.
    try:
        sig = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return []
    missing = []
    for i, (name, p) in enumerate(sig.parameters.items()):
        if i == 0 or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty and name not in init:
            missing.append(name)
    return missing


def _class_frame(cls: type) -> Frame | None:
    try:
        file = inspect.getsourcefile(cls)
        _, line = inspect.getsourcelines(cls)
        return Frame(file or "", line, cls.__name__)
    except (OSError, TypeError):
        return None


# ---- example inputs ------------------------------------------------------------------


def meta_inputs(specs: list[InputSpec]) -> list[torch.Tensor]:
    tensors = []
    for spec in specs:
        dtype = getattr(torch, spec.dtype)
        tensors.append(torch.empty(spec.shape, dtype=dtype, device="meta"))
    return tensors


def specs_of(tensors: list[torch.Tensor]) -> list[InputSpec]:
    return [InputSpec([int(d) for d in t.shape], dtype_name(t.dtype)) for t in tensors]


def user_example_inputs(module: ModuleType, cls: type[Any], is_top_level: bool, user_code: UserCode):
    """Inputs from an `example_inputs()` classmethod or module function, as meta tensors."""
    provider = None
    source = ""
    if "example_inputs" in vars(cls) or any(
        "example_inputs" in vars(b) for b in cls.__mro__[1:-1] if b.__module__ == cls.__module__
    ):
        provider = cls.example_inputs
        source = f"{cls.__name__}.example_inputs()"
    elif callable(getattr(module, "example_inputs", None)):
        provider = module.example_inputs
        source = "example_inputs()"
    if provider is None:
        return None, ""
    try:
        with torch.device("meta"):
            value = provider()
    except (Exception, SystemExit) as exc:
        raise LoadError("inputs", f"{source} failed: {type(exc).__name__}: {exc}", user_frame(exc, user_code)) from exc
    if isinstance(value, dict) and source == "example_inputs()":
        if cls.__name__ not in value:
            return None, ""
        value = value[cls.__name__]
    elif source == "example_inputs()" and not is_top_level:
        return None, ""
    tensors = _as_tensors(value, source)
    return tensors, source


def _as_tensors(value: Any, source: str) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not value:
        raise LoadError("inputs", f"{source} must return a tensor or a tuple of tensors, got {type(value).__name__}")
    out = []
    for v in value:
        if isinstance(v, torch.Tensor):
            out.append(v if v.device.type == "meta" else v.to("meta"))
        elif isinstance(v, (tuple, list, torch.Size)) and all(isinstance(d, int) for d in v):
            out.append(torch.empty(tuple(v), device="meta"))
        else:
            raise LoadError("inputs", f"{source} returned a {type(v).__name__}; return tensors (or shapes)")
    return out


def random_inputs(specs: list[InputSpec], device: str, seed: int) -> list[torch.Tensor]:
    """Seeded random values for `specs`: floats N(0, 1), bools 0/1, integers (token ids) in
    [0, high), or [0, 16) when the spec sets no bound."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for spec in specs:
        dtype = getattr(torch, spec.dtype)
        if dtype.is_floating_point:
            t = torch.randn(spec.shape, generator=gen).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, spec.shape, generator=gen).bool()
        else:  # token ids and other integer inputs: small values any vocabulary accepts, unless bounded
            t = torch.randint(0, spec.high or 16, spec.shape, generator=gen).to(dtype)
        out.append(t.to(device))
    return out


def forward_input_names(model: torch.nn.Module, count: int) -> list[str]:
    try:
        params = [
            p
            for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params][:count]
    return names + [f"input{i}" for i in range(len(names), count)]


def hint_for_inputs(name: str, bound: bool = False) -> str:
    """How to give `name` example inputs; `bound`: it is a model object bound at module level."""
    where = f"the line binding `{name}`" if bound else f"the `class {name}` line"
    provider = "a module-level example_inputs()" if bound else "an example_inputs() classmethod"
    return (
        f"give example inputs: `# fuselens: input=(16384, 1024) float32` on {where}, "
        f"[tool.fuselens.models.{name}] inputs = [[16384, 1024]] in pyproject.toml, "
        f"{provider}, or --input-shape on the command line"
    )


def takes_token_ids(model: torch.nn.Module) -> bool:
    """Whether the model starts by looking up token ids: a library model whose main input is
    `input_ids`, or any model whose first module with weights is an embedding."""
    main_input = getattr(model, "main_input_name", None)
    if isinstance(main_input, str):
        return main_input == "input_ids"
    first = next((m for m in model.modules() if next(m.parameters(recurse=False), None) is not None), None)
    return isinstance(first, torch.nn.Embedding)


def hint_for_init(class_name: str) -> str:
    return (
        f"give constructor arguments: [tool.fuselens.models.{class_name}] init = {{ ... }} in pyproject.toml, "
        f"or `# fuselens: init=(name=value, ...)` on the `class {class_name}` line, or give them defaults"
    )
