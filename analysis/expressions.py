"""Sympy expressions of the declared sizes as the report's `Expression` (`contracts/dynamic.py`).

The canonical form is sympy's: an expression is expanded, and printed the way sympy prints it,
which is the same every time for the same expression.  The tree is built from the expression's
own structure (its class and arguments), never from its text.
"""

from __future__ import annotations

from typing import Any

import sympy

from fuselens.contracts.dynamic import Expression, Tree

# Torch's integer functions (`torch.utils._sympy.functions`) and sympy's, by class name.
_FUNCTIONS = {
    "FloorDiv": "//",
    "CleanDiv": "//",
    "IntTrueDiv": "/",
    "PythonMod": "%",
    "Mod": "%",
    "FloorToInt": "floor",
    "floor": "floor",
    "CeilToInt": "ceil",
    "ceiling": "ceil",
    "Min": "min",
    "Max": "max",
}
_RELATIONS = {
    sympy.LessThan: "<=",
    sympy.StrictLessThan: "<",
    sympy.GreaterThan: ">=",
    sympy.StrictGreaterThan: ">",
    sympy.Equality: "==",
    sympy.Unequality: "!=",
}


class NotExpressible(ValueError):
    """An expression with a function the report's trees have no operator for."""


def canonical(expr: Any) -> sympy.Basic:
    """`expr` expanded, with each exact integer division written as its quotient."""
    expr = sympy.sympify(expr).replace(_is_division, _exact_quotient)
    return expr if isinstance(expr, (sympy.logic.boolalg.Boolean, sympy.Rel)) else sympy.expand(expr)


def _is_division(expr: sympy.Basic) -> bool:
    return type(expr).__name__ in ("FloorDiv", "CleanDiv")


def _exact_quotient(expr: sympy.Basic) -> sympy.Basic:
    """`(res**2) // res` is `res`: a view's inferred size divides exactly whenever the numerator is a
    multiple of the divisor for every value of the sizes (a polynomial quotient with integer coefficients)."""
    numerator, divisor = expr.args
    quotient = sympy.cancel(numerator / divisor)
    _, denominator = sympy.fraction(quotient)
    if denominator != 1:
        return expr
    if quotient.is_Integer:
        return quotient
    try:
        exact = all(c.is_integer for c in sympy.Poly(quotient).coeffs())
    except sympy.PolynomialError:  # (not a polynomial in the sizes: left as the division it is)
        return expr
    return quotient if exact else expr


def expression(expr: Any) -> Expression:
    """`expr` in its canonical form, as text and as a tree."""
    expr = canonical(expr)
    return Expression(str(expr), tree(expr))


def tree(expr: sympy.Basic) -> Tree:
    if expr is sympy.true or expr is sympy.false:
        return int(bool(expr))
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Rational):
        return ["/", int(expr.p), int(expr.q)]
    if isinstance(expr, sympy.Float):
        return float(expr)
    if isinstance(expr, sympy.Symbol):
        return expr.name
    if isinstance(expr, sympy.Add):
        return ["+", *(tree(t) for t in expr.as_ordered_terms())]
    if isinstance(expr, sympy.Mul):
        return ["*", *(tree(f) for f in expr.as_ordered_factors())]
    if isinstance(expr, sympy.Pow):
        return ["**", tree(expr.base), tree(expr.exp)]
    for relation, op in _RELATIONS.items():
        if isinstance(expr, relation):
            return [op, tree(expr.lhs), tree(expr.rhs)]
    if isinstance(expr, sympy.And):
        return ["and", *(tree(a) for a in sympy.ordered(expr.args))]
    if isinstance(expr, sympy.Or):
        return ["or", *(tree(a) for a in sympy.ordered(expr.args))]
    if isinstance(expr, sympy.Not):
        return ["not", tree(expr.args[0])]
    function = _FUNCTIONS.get(type(expr).__name__)
    if function is None:
        raise NotExpressible(f"{type(expr).__name__} in {expr}")
    args = expr.args if function not in ("min", "max") else sympy.ordered(expr.args)
    return [function, *(tree(a) for a in args)]
