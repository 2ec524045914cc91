"""A kernel's arguments, recorded once: its `@triton.jit` signature and the launcher's call of it are
both written from the same record, so the two cannot disagree on an argument's place.

Each run-time argument is a parameter name (or several) and what the launcher passes for it: the
launcher's local of the same name (`d0`, `R`), another expression (`x` for `in0_ptr`, `st0[1]` for
`in0_s1`), or one sequence unpacked into several parameters (`*pitches` for `p0, p1, ...`).  The
constexpr parameters (tile sizes, layout flags) come last; their values are launch decisions, which
each launch gives by name when it writes its call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# The width a kernel's `def` line is wrapped at.
_SIGNATURE_WIDTH = 96


@dataclass(frozen=True)
class _Runtime:
    names: tuple[str, ...]  # the kernel's parameters
    value: str  # what the launcher passes for them: one expression, or `*seq` unpacked into several


class KernelArgs:
    """The arguments of one kernel, in order: run-time ones, then constexprs."""

    def __init__(self) -> None:
        self._runtime: list[_Runtime] = []
        self._constexprs: list[str] = []

    def copy(self) -> KernelArgs:
        """A record to add a kernel's own arguments to, leaving this one as it is."""
        other = KernelArgs()
        other._runtime = list(self._runtime)
        other._constexprs = list(self._constexprs)
        return other

    def add(self, name: str, value: str | None = None) -> KernelArgs:
        """A run-time parameter `name`, passed the launcher's `value` (its local `name` by default)."""
        self._runtime.append(_Runtime((name,), name if value is None else value))
        return self

    def add_each(self, names: Iterable[str]) -> KernelArgs:
        """Run-time parameters passed the launcher's locals of the same names."""
        for name in names:
            self.add(name)
        return self

    def unpacked(self, names: Sequence[str], sequence: str) -> KernelArgs:
        """Run-time parameters `names`, passed the items of the launcher's `sequence` (as many as there
        are names: none at all where there are none)."""
        self._runtime.append(_Runtime(tuple(names), f"*{sequence}"))
        return self

    def constexpr(self, *names: str) -> KernelArgs:
        """Constexpr parameters, which each launch passes by name."""
        self._constexprs += names
        return self

    def value_of(self, name: str) -> str:
        """What the launcher passes for the kernel's parameter `name`: `pitches[1]` for `p1`."""
        for arg in self._runtime:
            if name in arg.names:
                if arg.value.startswith("*"):
                    return f"{arg.value[1:]}[{arg.names.index(name)}]"
                return arg.value
        raise KeyError(name)

    def parameters(self) -> list[str]:
        """The signature's parameters, in order."""
        names = [name for arg in self._runtime for name in arg.names]
        return names + [f"{name}: tl.constexpr" for name in self._constexprs]

    def signature(self, kernel_name: str, wrap: bool = True) -> list[str]:
        """The kernel's `def` line, wrapped at `_SIGNATURE_WIDTH` (with `wrap`), under `@triton.jit`."""
        if not wrap:
            return ["@triton.jit", f"def {kernel_name}({', '.join(self.parameters())}):"]
        lines, line = [], f"def {kernel_name}("
        for parameter in self.parameters():
            piece = parameter + ", "
            if len(line) + len(piece) > _SIGNATURE_WIDTH:
                lines.append(line.rstrip())
                line = "    "
            line += piece
        lines.append(line.rstrip(", ") + "):")
        return ["@triton.jit", *lines]

    def call(
        self,
        kernel: str,
        grid: str,
        constexprs: Mapping[str, str],
        options: Sequence[str] = (),
        break_before: str = "",
        one_line: bool = False,
    ) -> list[str]:
        """The launch `kernel[grid](...)`: the run-time values on its first line, then each constexpr
        by name (`constexprs`, one for each, in the signature's order) and the launch `options`
        (`num_warps=warps`) on the next, or on two from `break_before` on (or all on one, `one_line`)."""
        if list(constexprs) != self._constexprs:
            raise ValueError(f"{kernel} takes constexprs {self._constexprs}, given {list(constexprs)}")
        values = ", ".join(arg.value for arg in self._runtime)
        keywords = [f"{name}={value}" for name, value in constexprs.items()] + list(options)
        if one_line:
            return [f"{kernel}[{grid}]({', '.join([values, *keywords])})"]
        if break_before:
            at = [k.split("=", 1)[0] for k in keywords].index(break_before)
            rows = [keywords[:at], keywords[at:]]
        else:
            rows = [keywords]
        lines = [f"{kernel}[{grid}]({values},"]
        lines += ["    " + ", ".join(row) + ("," if k < len(rows) - 1 else ")") for k, row in enumerate(rows)]
        return lines
