"""Where a Python number an op takes comes from, so that a kernel takes it from its caller.

`x + self.eps` reaches torch as `Tensor.__add__(x, 1e-06)`: the value alone would be baked into
the kernel, and another instance of the layer (another eps, another head size) would silently
compute with the analyzed one's.  At the moment of the call the frame that made it is live: its
source, at the call's span, says how each argument is spelled.  A literal (`2`, `-1e-6`) and a true
constant (`math.pi`, `torch.finfo(torch.float32).eps`: read from a library's modules, or imported
from one) are the same for every call and stay in the kernel.  Anything else the code reads
becomes a `NamedFloat`/`NamedInt` that knows what each frame of model code calls it: the frame's
locals (`self.eps`, `scale`, `math.sqrt(self.head_dim)`; its arguments, those left at their
defaults too; a nested function's free variables) and, in model code, its module's globals
(`min_value`, `config.EPS` of a config module of the model's own), which code may change after
the model is built.  What each frame calls it:

- the calling frame itself: the expression as written;
- an outer frame: the same expression where every name it reads is the same there: `self`
  reached through that frame's `self` (`self.eps` inside `RMSNorm.forward` is `self.mlp_norm.eps`
  in the block), a global of the same module (or of a module the frame imports: `norms.EPS`), a
  free variable as the enclosing function that holds it calls it, an argument the frame's call
  leaves at its default as the function it calls holds it (`rms_norm.__defaults__[0]`);
- an outer frame, for a float read from locals: a local or an attribute of its `self` holding the
  very same object (a `scaling` argument is `self.scaling` in the caller that passed it).
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import linecache
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .graph import NamedFloat, NamedInt
from .parsed import parse

# Frames between a torch function and the code that called it: dispatch and Python wrappers.
_WRAPPER_FILES = tuple(
    os.path.join(os.path.dirname(torch.__file__ or ""), name)
    for name in ("overrides.py", "_tensor.py", "_jit_internal.py")
)

Span = tuple[int, int, int, int]

# What a global holds that is code, not data: constant unless the model's own code defines it.
_CODE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType)


class _Source:
    """A file's syntax tree, its expressions (and statements) by span, and the names its module-level
    imports bind (name -> the module it comes from: `np` -> numpy, `pi` of `from math import pi` -> math)."""

    def __init__(self, text: str):
        self.text = text
        self.by_span: dict[Span, ast.AST] = {}
        self.imported: dict[str, str] = {}
        try:
            tree = parse(text)
        except SyntaxError:
            return
        for statement in tree.body:
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    self.imported[alias.asname or alias.name.split(".")[0]] = alias.name
            elif isinstance(statement, ast.ImportFrom) and not statement.level and statement.module:
                for alias in statement.names:
                    self.imported[alias.asname or alias.name] = statement.module
        for node in ast.walk(tree):
            if getattr(node, "end_lineno", None) is None or not hasattr(node, "lineno"):
                continue
            span = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
            if isinstance(node, ast.expr) or span not in self.by_span:
                self.by_span[span] = node


@functools.lru_cache(maxsize=32)
def _parsed(text: str) -> _Source:
    """The parsed source of a file's `text`, kept across traces: an analysis traces several paths, and the
    worker host's warm-up parses torch's own files (`nn/functional.py`, a tenth of a second each) once for
    every job it forks.  Nothing changes a `_Source` after it is made."""
    return _Source(text)


class ScalarSources:
    """Tags the numbers of torch calls with their provenance; one per trace (it caches parsed files)."""

    def __init__(
        self,
        model_code: Callable[[str], bool],
        invocation: Callable[[types.FrameType], tuple[int, str]],
        module_path: Callable[[Any], str | None],
        made_at: Callable[[Any, types.FrameType], Span | None],
        stop_at: types.CodeType | None = None,
    ):
        self._model_code = model_code  # whether a file is model code (the user's or a library's)
        self._stop_at = stop_at  # the code of the frame that runs the model: the frames past it are the tool's
        self._invocation = invocation  # a frame's invocation number and its `self`'s module path
        self._module_path = module_path  # the module path of an object, None if it is no module of the model
        self._made_at = made_at  # the span, in a frame, of the expression whose op made a tensor
        self._sources: dict[str, _Source] = {}
        self._positions: dict[int, tuple[types.CodeType, list]] = {}  # by id: as the recorder's (capture.py)
        self._named_before: dict[tuple, NamedFloat | NamedInt] = {}

    def tag(self, func: Callable, start: types.FrameType | None, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """`args`, `kwargs` with each number read from the caller's state replaced by a named one."""
        if not any(_number(v) for v in (*args, *kwargs.values())):
            return args, kwargs
        frame = _calling_frame(func, start)
        if frame is None:
            return args, kwargs
        spelled = self._spelling(func, frame, len(args), list(kwargs), args[0] if args else None)
        new_args = tuple(self._named(v, spelled.get(i), frame) for i, v in enumerate(args))
        new_kwargs = {k: self._named(v, spelled.get(k), frame) for k, v in kwargs.items()}
        return new_args, new_kwargs

    # ---- how the call spells its arguments ---------------------------------------------------

    def _spelling(
        self, func: Callable, frame: types.FrameType, nargs: int, kwarg_names: list[str], tensor_arg: Any
    ) -> dict[int | str, ast.expr]:
        """The expression of each argument position (and keyword) at the call the frame is making."""
        node = self._call_node(frame)
        if node is None:
            return {}
        name = getattr(func, "__name__", "")
        if isinstance(node, ast.BinOp | ast.Compare):
            left, right = node.left, node.right if isinstance(node, ast.BinOp) else node.comparators[0]
            if name.startswith("__r") and name != "__rshift__":  # `2 - x` reaches torch as `x.__rsub__(2)`
                return {0: right, 1: left}
            # `3 * x` reaches torch as `x.mul(3)` too: the tensor's side says which operand is which.
            tensor = self._tensor_side((left, right), tensor_arg, frame)
            if tensor is None:
                return {}
            return {0: left, 1: right} if tensor is left else {0: right, 1: left}
        if isinstance(node, ast.AugAssign):
            return {0: node.target, 1: node.value}
        if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
            return {}
        keywords: dict[str, ast.expr] = {k.arg: k.value for k in node.keywords if k.arg}
        positional = list(node.args)
        if _is_method(func) and isinstance(node.func, ast.Attribute) and len(positional) == nargs - 1:
            positional = [node.func.value, *positional]  # `x.pow(2)`: the receiver is the first argument
        if inspect.isfunction(func):  # the call and torch's dispatch may pass an argument differently
            return _by_parameter(func, positional, keywords, nargs, kwarg_names)
        spelled: dict[int | str, ast.expr] = {key: value for key, value in keywords.items()}
        if len(positional) == nargs:
            spelled.update(enumerate(positional))
        return spelled

    def _tensor_side(self, sides: tuple[ast.expr, ast.expr], tensor: Any, frame: types.FrameType) -> ast.expr | None:
        """Which operand expression evaluated to `tensor`: a name (or attribute) bound to it, or the one
        holding the expression of the op that made it."""
        for side in sides:
            if _bound_to(side, frame) is tensor:
                return side
        made = self._made_at(tensor, frame)
        if made is not None:
            for side in sides:
                if _within(made, side):
                    return side
        return None

    def _call_node(self, frame: types.FrameType) -> ast.AST | None:
        source = self._source(frame.f_code.co_filename)
        code = frame.f_code
        known = self._positions.get(id(code))
        if known is None:
            known = self._positions[id(code)] = (code, list(code.co_positions()))
        positions = known[1]
        span = _span_at(positions, frame.f_lasti // 2)
        return source.by_span.get(span) if span is not None else None

    # ---- what each frame calls a number --------------------------------------------------------

    def _named(self, value: Any, expr: ast.expr | None, frame: types.FrameType) -> Any:
        if not _number(value) or expr is None:
            return value
        names = _names_read(expr)
        if not any(self._reads_state(name, frame) for name in names):
            return value  # a literal or a true constant: the same in every call
        text = _unparsed(expr)
        at: dict[int, str] = {}
        owner = frame.f_locals.get("self") if "self" in names else None
        owner_path = self._module_path(owner) if owner is not None else None
        for f in self._model_frames(frame):
            invocation, _ = self._invocation(f)
            if f is frame:
                at[invocation] = text
                continue
            same = self._as_written_in(expr, names, frame, owner_path, f)
            if same is None and isinstance(value, float):
                same = _holding(value, f)
            if same is not None:
                at[invocation] = same
        kind = NamedFloat if isinstance(value, float) else NamedInt
        # One object for every read of the same number by the same code (`scale`, twice in a cluster):
        # a kernel takes it once.
        key = (kind, value, text, tuple(sorted(at.items())))
        named = self._named_before.get(key)
        if named is None:
            named = self._named_before[key] = kind(value, text, at)
        return named

    def _reads_state(self, name: str, frame: types.FrameType) -> bool:
        """Whether `name`, read in `frame`, may hold another value in another call or instance: a local
        (an argument, a free variable), or in model code a global of its module other than a true
        constant (a library's module, or what was imported from one: `math`, `from math import pi`)."""
        if name in frame.f_locals:
            return True
        if name not in frame.f_globals or not self._model_code(frame.f_code.co_filename):
            return False  # a builtin (`float`), or torch's own code reading its own tables
        imported = self._source(frame.f_code.co_filename).imported.get(name)
        if imported is not None:
            return self._model_module(imported)
        return self._of_model_code(frame.f_globals[name])

    def _model_module(self, module_name: str) -> bool:
        """Whether the module `module_name` (as imported: its first part is enough) is model code."""
        module = sys.modules.get(module_name) or sys.modules.get(module_name.split(".")[0])
        return self._in_model_code(module)

    def _in_model_code(self, module: Any) -> bool:
        file = getattr(module, "__file__", None)
        return isinstance(file, str) and self._model_code(file)

    def _of_model_code(self, held: Any) -> bool:
        """A global's value that may change: data (a number, a config object), or a module, function or
        class of the model's own code (whose attributes or results may be).  Modules, functions and
        classes of libraries (`torch`, `math`) are constants."""
        if isinstance(held, types.ModuleType):
            return self._in_model_code(held)
        if isinstance(held, _CODE):
            return self._model_module(getattr(held, "__module__", "") or "")
        return True

    def _as_written_in(
        self, expr: ast.expr, names: frozenset[str], frame: types.FrameType, owner_path: str | None, f: types.FrameType
    ) -> str | None:
        """`expr`, read in `frame`, as the outer frame `f` reaches the same values: each name it reads
        rebased (`_rebase`); None where some name is out of `f`'s reach."""
        replacements: dict[str, str] = {}
        for name in names:
            if name == "self" and name in frame.f_locals:
                path = self._module_path(f.f_locals.get("self"))  # None in a plain function
                reached = _reached_self(owner_path, path) if owner_path is not None and path is not None else None
                if reached is None:
                    return None
                replacements[name] = reached
            elif name in frame.f_locals and not _same_cell(name, frame, f):
                default = self._default_in(name, frame, f)
                if default is None:
                    return None
                replacements[name] = default
            elif name in frame.f_globals:
                spelled = _global_in(name, frame, f, constant=not self._reads_state(name, frame))
                if spelled is None:
                    return None
                replacements[name] = spelled
            elif name in f.f_locals or name in f.f_globals:
                return None  # a builtin that `f` shadows
        return _rebase(expr, replacements)

    def _default_in(self, name: str, frame: types.FrameType, f: types.FrameType) -> str | None:
        """A parameter `name` of `frame`'s function that the call `f` makes of it leaves at its default:
        the default, as `f` reaches it through what it calls (`rms_norm.__defaults__[0]`, of
        `rms_norm(x, self.weight)` for `def rms_norm(x, weight, eps=1e-6)`); None otherwise."""
        call = self._call_node(f) if frame.f_back is f else None
        if not isinstance(call, ast.Call) or any(isinstance(a, ast.Starred) for a in call.args):
            return None
        keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
        if len(keywords) != len(call.keywords):  # a `**kwargs` passed on
            return None
        function = _callee(call.func, f)
        code = getattr(getattr(function, "__func__", function), "__code__", None)
        if function is None or code is not frame.f_code:
            return None
        try:
            passed = _signature(function).bind_partial(*call.args, **keywords)
        except (TypeError, ValueError):
            return None
        if name in passed.arguments:
            return None
        callee = _unparsed(call.func)
        defaults = getattr(function, "__defaults__", None) or ()
        positional = code.co_varnames[: code.co_argcount]
        if name in positional[len(positional) - len(defaults) :]:
            k = positional.index(name) - (len(positional) - len(defaults))
            spelled, default = f"{callee}.__defaults__[{k}]", defaults[k]
        else:
            keyword = getattr(function, "__kwdefaults__", None) or {}
            if name not in keyword:
                return None
            spelled, default = f"{callee}.__kwdefaults__[{name!r}]", keyword[name]
        return spelled if default is frame.f_locals[name] else None

    def _source(self, filename: str) -> _Source:
        source = self._sources.get(filename)
        if source is None:
            source = self._sources[filename] = _parsed("".join(linecache.getlines(filename)))
        return source

    def _model_frames(self, frame: types.FrameType) -> Iterator[types.FrameType]:
        f: types.FrameType | None = frame
        while f is not None and f.f_code is not self._stop_at:
            if self._model_code(f.f_code.co_filename):
                yield f
            f = f.f_back


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_method(func: Callable) -> bool:
    """A Tensor method (`x.pow`), whose receiver is its first argument, rather than a function."""
    owner = getattr(func, "__objclass__", None)
    if owner is not None:
        return owner.__name__ in ("TensorBase", "Tensor", "_TensorBase")
    qualname = getattr(func, "__qualname__", "")
    return qualname.startswith(("Tensor.", "TensorBase."))


def _calling_frame(func: Callable, frame: types.FrameType | None) -> types.FrameType | None:
    """The frame whose code called `func`: past torch's dispatch, its Python wrappers and the frame of
    `func` itself (a Python function such as `F.group_norm` dispatches from inside itself)."""
    code = getattr(func, "__code__", None)
    while frame is not None and (frame.f_code.co_filename.startswith(_WRAPPER_FILES) or frame.f_code is code):
        frame = frame.f_back
    return frame


def _span_at(positions: list, index: int) -> Span | None:
    if not 0 <= index < len(positions):
        return None
    line, end_line, col, end_col = positions[index]
    if line is None or end_line is None or col is None or end_col is None:
        return None
    return line, col, end_line, end_col


def _by_parameter(
    func: Callable, positional: list[ast.expr], keywords: dict[str, ast.expr], nargs: int, kwarg_names: list[str]
) -> dict[int | str, ast.expr]:
    """`F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)` reaches the mode as
    `(x, num_groups)` and `weight=, bias=, eps=`: both matched to the function's parameters."""
    try:
        signature = _signature(func)
        written = signature.bind_partial(*positional, **keywords).arguments
        names = list(signature.parameters)
    except (TypeError, ValueError):
        return {}
    spelled: dict[int | str, ast.expr] = {}
    for i in range(min(nargs, len(names))):
        if names[i] in written and isinstance(written[names[i]], ast.expr):
            spelled[i] = written[names[i]]
    for key in kwarg_names:
        if isinstance(written.get(key), ast.expr):
            spelled[key] = written[key]
    return spelled


def _bound_to(expr: ast.expr, frame: types.FrameType) -> Any:
    """What a name or an attribute chain (`x`, `self.weight`) is bound to in `frame`, read without running
    code (no properties, no `__getattr__` beyond a module's own tables); None otherwise."""
    if isinstance(expr, ast.Name):
        return frame.f_locals.get(expr.id)
    if isinstance(expr, ast.Attribute):
        owner = _bound_to(expr.value, frame)
        if owner is None:
            return None
        found = getattr(owner, "__dict__", {}).get(expr.attr)
        if found is None:
            for table in ("_parameters", "_buffers", "_modules"):
                found = getattr(owner, "__dict__", {}).get(table, {}).get(expr.attr)
                if found is not None:
                    break
        return found
    return None


def _within(span: Span, expr: ast.expr) -> bool:
    outer = (expr.lineno, expr.col_offset, expr.end_lineno or expr.lineno, expr.end_col_offset or 0)
    return (outer[0], outer[1]) <= (span[0], span[1]) and (span[2], span[3]) <= (outer[2], outer[3])


# An expression's text, the names it reads and its text rebased, asked for each number of each op: made
# once for an expression of a parsed source (`_parsed`, which keeps the expressions), whichever layer's
# call reaches it.  The caches hold the expressions they are keyed by, so a key is never another's.


@functools.lru_cache(maxsize=4096)
def _unparsed(expr: ast.AST) -> str:
    return ast.unparse(expr)


@functools.lru_cache(maxsize=4096)
def _names_read(expr: ast.expr) -> frozenset[str]:
    return frozenset(n.id for n in ast.walk(expr) if isinstance(n, ast.Name))


def _signature(function: Callable) -> inspect.Signature:
    """`inspect.signature(function)`; a bound method's from its function's (the same for every `self`)."""
    method = getattr(function, "__func__", None)
    if isinstance(function, types.MethodType) and method is not None:
        return _bound_signature(method, function)
    try:
        return _function_signature(function)
    except TypeError:  # (unhashable)
        return inspect.signature(function)


@functools.lru_cache(maxsize=1024)
def _function_signature(function: Callable) -> inspect.Signature:
    return inspect.signature(function)


_BOUND: dict[Any, tuple[Any, inspect.Signature]] = {}  # function -> (the function, its methods' signature)


def _bound_signature(method: Any, bound: types.MethodType) -> inspect.Signature:
    known = _BOUND.get(id(method))
    if known is None or known[0] is not method:
        known = _BOUND[id(method)] = (method, inspect.signature(bound))
    return known[1]


def _reached_self(from_path: str, to_path: str) -> str | None:
    """The `self` of a method of the module at `from_path` as a method of the module at `to_path` (an
    ancestor) reaches it: `self.mlp_norm` from the block; None from elsewhere."""
    if to_path and from_path != to_path and not from_path.startswith(to_path + "."):
        return None
    rest = from_path[len(to_path) + 1 :] if to_path else from_path
    return "self" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in rest.split(".") if p)


def _rebase(expr: ast.expr, replacements: dict[str, str]) -> str:
    """`expr` with each name of `replacements` replaced by its expression: `self.eps` -> `self.mlp_norm.eps`."""
    if not replacements or all(name == text for name, text in replacements.items()):
        return _unparsed(expr)
    return _rebased(expr, tuple(sorted(replacements.items())))


@functools.lru_cache(maxsize=4096)
def _rebased(expr: ast.expr, replacements: tuple[tuple[str, str], ...]) -> str:
    parsed = {name: ast.parse(text, mode="eval").body for name, text in replacements}

    class _Rebase(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return parsed.get(node.id, node)

    return ast.unparse(_Rebase().visit(ast.parse(ast.unparse(expr), mode="eval")).body)


def _same_cell(name: str, frame: types.FrameType, f: types.FrameType) -> bool:
    """Whether the local `name` of `frame` is the very variable `f` calls `name`: a free variable of a
    function nested in `f`'s, which `f` holds as a cell (the closure's `scale` in the method that
    defined it)."""
    return (
        name in frame.f_code.co_freevars
        and name in f.f_code.co_cellvars
        and f.f_locals.get(name) is frame.f_locals[name]
    )


def _callee(expr: ast.expr, frame: types.FrameType) -> Any:
    """The function a call's `expr` names in `frame` (`rms_norm`, `self.norm_fn`, `helpers.rms_norm`),
    looked up without running code (no properties, no `__getattr__`); None where it is not found."""
    if isinstance(expr, ast.Name):
        scopes = (frame.f_locals, frame.f_globals, vars(builtins))
        return next((scope[expr.id] for scope in scopes if expr.id in scope), None)
    if isinstance(expr, ast.Attribute):
        owner = _callee(expr.value, frame)
        if owner is None:
            return None
        try:
            found = inspect.getattr_static(owner, expr.attr)
        except AttributeError:
            return None
        # A method found on the class: bound to the instance, as the call binds it.
        if isinstance(found, types.FunctionType) and not isinstance(owner, (type, types.ModuleType)):
            return types.MethodType(found, owner)
        return found
    return None


def _global_in(name: str, frame: types.FrameType, f: types.FrameType, constant: bool) -> str | None:
    """The global `name` of `frame`'s module as `f` reaches it: the name itself in the same module
    (where no local of `f` hides it), or, for a `constant` (`math`), in one that binds the same
    object to it; the module's name and the global's in one that imports it (`norms.EPS`); None where
    `f` cannot reach it."""
    if name not in f.f_locals and (
        f.f_globals is frame.f_globals or (constant and f.f_globals.get(name) is frame.f_globals[name])
    ):
        return name
    for alias, held in f.f_globals.items():
        if isinstance(held, types.ModuleType) and vars(held) is frame.f_globals and alias not in f.f_locals:
            return f"{alias}.{name}"
    return None


def _holding(value: float, frame: types.FrameType) -> str | None:
    """A name of `frame` bound to this very float object: a local, or an attribute of its `self`."""
    for name, held in frame.f_locals.items():
        if held is value and name != "self" and not hasattr(builtins, name):
            return name
    owner = frame.f_locals.get("self")
    for name, held in getattr(owner, "__dict__", {}).items():
        if held is value and not name.startswith("_"):
            return f"self.{name}"
    return None
