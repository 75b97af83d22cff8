"""A small prover: multiply out the polynomial a subgraph computes, to recognise tanh-GELU however it is written.

Exporters write 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in many arrangements (Pow or Mul for the cube,
the 0.5 first or last, Div instead of Mul). Rather than one pattern per arrangement, the ops between x and
tanh, and after tanh, are multiplied out as polynomials in x and t = tanh(...); a match is a proof. Only
Mul/Add/Sub/Div-by-constant/Pow-by-small-integer/same-type Cast of x and scalar constants expand;
coefficients must equal the exact ones to within a few units of fp32 rounding.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ..engine import other_input, sole_consumer

__all__ = ["prove_tanh_gelu"]

#: ops whose result is a polynomial in their inputs (with scalar constants); Cast only to the same type
_POLY_OPS = {"Mul", "Add", "Sub", "Div", "Pow", "Cast", "Identity"}
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715
#: products of fp32 constants carry a few fp32 roundings (2^-24 each): a handful of ulps, not 0.1%
_RTOL = 8 * float(np.finfo(np.float32).eps)

Poly = dict  # {(power of x, power of t): coefficient}


def _pmul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for (i, j), c in a.items():
        for (k, m), d in b.items():
            out[(i + k, j + m)] = out.get((i + k, j + m), 0.0) + c * d
    return out


def _padd(a: Poly, b: Poly, sign: float = 1.0) -> Poly:
    out = dict(a)
    for key, c in b.items():
        out[key] = out.get(key, 0.0) + sign * c
    return {k: v for k, v in out.items() if v != 0.0}


def _poly_is(p: Poly, want: dict, rtol: float = _RTOL) -> bool:
    """Whether polynomial `p` has exactly the terms of `want`, each coefficient within rtol."""
    p = {k: v for k, v in p.items() if abs(v) > 1e-12}
    return set(p) == set(want) and all(math.isclose(p[k], want[k], rel_tol=rtol) for k in want)


class _PolyOf:
    """The polynomial in one variable `x` that a value computes, and the nodes used (None: not a polynomial)."""

    def __init__(self, cx, x: ir.Value, dt):
        self.cx, self.x, self.dt = cx, x, dt
        self.nodes: list[ir.Node] = []
        self.memo: dict[int, Poly | None] = {}

    def of(self, v: ir.Value | None, depth: int = 0) -> Poly | None:
        if v is None or depth > 16:
            return None
        if v is self.x:
            return {(1, 0): 1.0}
        if id(v) in self.memo:
            return self.memo[id(v)]
        c = self.cx.constant(v)
        if c is not None:
            ok = c.size == 1 and c.dtype == self.dt and not self.cx.broadcasts_up(c, self.x)
            result = {(0, 0): float(c.reshape(-1)[0])} if ok else None
        else:
            result = self._node(v.producer(), depth)
        self.memo[id(v)] = result
        return result

    def _node(self, n: ir.Node | None, depth: int) -> Poly | None:
        if n is None or n.domain not in ("", "ai.onnx") or n.op_type not in _POLY_OPS or len(n.outputs) != 1 or \
                not self.cx.free(n):
            return None
        if n.op_type in ("Cast", "Identity"):
            if n.op_type == "Cast" and self.cx.dtype(n.outputs[0]) != self.dt:
                return None
            r = self.of(n.inputs[0], depth + 1)
        elif len(n.inputs) != 2:
            return None
        else:
            a = self.of(n.inputs[0], depth + 1)
            if a is None:
                return None
            if n.op_type in ("Div", "Pow"):
                r = self._div_pow(n, a)
            else:
                b = self.of(n.inputs[1], depth + 1)
                if b is None:
                    return None
                r = _pmul(a, b) if n.op_type == "Mul" else _padd(a, b, 1.0 if n.op_type == "Add" else -1.0)
        if r is not None and n not in self.nodes:
            self.nodes.append(n)
        return r

    def _div_pow(self, n: ir.Node, a: Poly) -> Poly | None:
        k = self.cx.constant(n.inputs[1])
        if k is None or k.size != 1 or self.cx.broadcasts_up(k, self.x):
            return None
        k = float(k.reshape(-1)[0])
        if n.op_type == "Div":
            return None if k == 0.0 else {key: c / k for key, c in a.items()}
        if k not in (1.0, 2.0, 3.0):
            return None
        r = a
        for _ in range(int(k) - 1):
            r = _pmul(r, a)
        return r


def _leaves(cx, start: ir.Value) -> list[ir.Value]:
    """Candidate x values behind `start`: non-constant inputs reachable through polynomial ops, nearest first."""
    seen, order, frontier = set(), [], [start]
    while frontier and len(order) < 32:
        nxt = []
        for v in frontier:
            n = v.producer()
            if n is None or n.domain not in ("", "ai.onnx") or n.op_type not in _POLY_OPS:
                continue
            for i in n.inputs:
                if i is not None and id(i) not in seen and cx.constant(i) is None:
                    seen.add(id(i))
                    order.append(i)
                    nxt.append(i)
        frontier = nxt
    return order


def _outer(cx, tanh: ir.Node, x: ir.Value, dt) -> list[ir.Node] | None:
    """The ops after tanh, following single consumers, until the value is 0.5 * x * (1 + t)."""
    outer = _PolyOf(cx, x, dt)
    cur, poly, chain = tanh.outputs[0], {(0, 1): 1.0}, []
    for _ in range(6):
        n = sole_consumer(cur)
        if n is None or n.domain not in ("", "ai.onnx") or n.op_type not in ("Mul", "Add", "Sub", "Div", "Cast") or \
                not cx.free(n) or len(n.outputs) != 1:
            return None
        if n.op_type == "Cast":
            if cx.dtype(n.outputs[0]) != dt:
                return None
        else:
            other = other_input(n, cur)
            o = outer.of(other) if other is not None else None
            if o is None or any(j for (_, j) in o):
                return None
            if n.op_type == "Mul":
                poly = _pmul(poly, o)
            elif n.op_type == "Div":
                if n.inputs[0] is not cur or set(o) != {(0, 0)} or o[(0, 0)] == 0.0:
                    return None
                poly = {k: c / o[(0, 0)] for k, c in poly.items()}
            elif n.op_type == "Add":
                poly = _padd(poly, o)
            else:  # Sub(cur, other) or Sub(other, cur)
                poly = _padd(poly, o, -1.0) if n.inputs[0] is cur else _padd(o, poly, -1.0)
        chain.append(n)
        cur = n.outputs[0]
        if _poly_is(poly, {(1, 0): 0.5, (1, 1): 0.5}):
            return outer.nodes + chain
    return None


def prove_tanh_gelu(cx, tanh: ir.Node) -> tuple[list[ir.Node], ir.Value] | None:
    """(member nodes, x) when the graph around `tanh` computes exactly tanh-GELU of x, else None."""
    dt = cx.dtype(tanh.inputs[0])
    inner_want = {(1, 0): _SQRT_2_OVER_PI, (3, 0): _SQRT_2_OVER_PI * _CUBIC}
    for x in _leaves(cx, tanh.inputs[0]):
        inner = _PolyOf(cx, x, dt)
        # the coefficients carry a few roundings of the model's dtype (float16's are 2^-11 each)
        rtol = _RTOL if dt != np.dtype(np.float16) else 8 * float(np.finfo(np.float16).eps)
        if cx.dtype(x) != dt or not _poly_is(inner.of(tanh.inputs[0]) or {}, inner_want, rtol):
            continue
        outer = _outer(cx, tanh, x, dt)
        if outer is None:
            return None
        return list(dict.fromkeys(inner.nodes + [tanh] + outer)), x
    return None
