"""The exercise of notebook 03: the max_min_clip rule, Max(x, lo) -> Min(., hi) -> Clip(x, lo, hi)."""

import numpy as np

from fusionlab.passes.engine import Match, Refused, Rule, is_op, other_input, sole_consumer


def _split(cx, node):
    """(x, the constant operand) of a binary node with exactly one constant input, else None."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return None
    consts = [cx.constant(v) for v in node.inputs]
    if (consts[0] is None) == (consts[1] is None):
        return None
    i = 0 if consts[0] is None else 1
    return node.inputs[i], consts[1 - i]


class MaxMinClip(Rule):
    """Reference: Max(x, lo) -> Min(., hi) with scalar constant bounds that keep x's rank -> Clip(x, lo, hi)."""

    names = ("max_min_clip",)
    anchors = ("Max",)
    fixed = True

    def match(self, cx, mx):
        found = _split(cx, mx)
        if found is None:
            return None
        x, lo = found
        mn = sole_consumer(mx.outputs[0])
        if not is_op(mn, "Min") or not cx.free(mn):
            return None
        other = other_input(mn, mx.outputs[0])
        hi = cx.constant(other) if other is not None else None
        if hi is None:
            return None
        for name, c in (("lower", lo), ("upper", hi)):
            if c.size != 1:
                raise Refused(f"the {name} bound has shape {list(c.shape)}: Clip takes one scalar")
            if cx.broadcasts_up(c, x):
                raise Refused(f"the {name} bound of rank {c.ndim} would broadcast x up a rank")
            if c.dtype != cx.dtype(x):
                raise Refused(f"the {name} bound is {c.dtype}, x is {cx.dtype(x)}")
        bounds = (lo.reshape(()), hi.reshape(()))
        return Match("max_min_clip", mx, [mx, mn], "Max then Min with scalar constant bounds", "Clip",
                     data=(x, bounds))

    def rewrite(self, cx, m):
        x, (lo, hi) = m.data
        base = m.anchor.name
        lo_v = cx.initializer(f"{base}_min", np.array(lo))
        hi_v = cx.initializer(f"{base}_max", np.array(hi))
        return [cx.node("Clip", [x, lo_v, hi_v], base=f"{base}_clip")]


class ClipAnyBound(MaxMinClip):
    """WRONG: takes any constant bound, per-channel ones too (Clip's min and max must be scalars)."""

    def match(self, cx, mx):
        found = _split(cx, mx)
        if found is None:
            return None
        x, lo = found
        mn = sole_consumer(mx.outputs[0])
        if not is_op(mn, "Min") or not cx.free(mn):
            return None
        other = other_input(mn, mx.outputs[0])
        hi = cx.constant(other) if other is not None else None
        if hi is None:
            return None
        return Match("max_min_clip", mx, [mx, mn], "Max then Min", "Clip", data=(x, (lo, hi)))

    def rewrite(self, cx, m):
        x, (lo, hi) = m.data
        lo, hi = (c.reshape(()) if c.size == 1 else c for c in (lo, hi))  # a per-channel bound slips through
        base = m.anchor.name
        return [cx.node("Clip", [x, cx.initializer(f"{base}_min", lo), cx.initializer(f"{base}_max", hi)],
                        base=f"{base}_clip")]


class LowerBoundOnly(MaxMinClip):
    """WRONG: checks the size and rank of the lower bound only; a per-channel upper bound slips through."""

    def match(self, cx, mx):
        found = _split(cx, mx)
        if found is None:
            return None
        x, lo = found
        mn = sole_consumer(mx.outputs[0])
        if not is_op(mn, "Min") or not cx.free(mn):
            return None
        other = other_input(mn, mx.outputs[0])
        hi = cx.constant(other) if other is not None else None
        if hi is None:
            return None
        if lo.size != 1 or cx.broadcasts_up(lo, x) or lo.dtype != cx.dtype(x):
            raise Refused("the lower bound must be a scalar of x's dtype that keeps x's rank")
        return Match("max_min_clip", mx, [mx, mn], "Max then Min", "Clip", data=(x, (lo.reshape(()), hi)))

    def rewrite(self, cx, m):
        x, (lo, hi) = m.data
        base = m.anchor.name
        hi = hi.reshape(()) if hi.size == 1 else hi
        return [cx.node("Clip", [x, cx.initializer(f"{base}_min", lo), cx.initializer(f"{base}_max", hi)],
                        base=f"{base}_clip")]


class AnyUpperInput(MaxMinClip):
    """WRONG: takes the Min's other input as the upper bound without asking that it be a constant."""

    def match(self, cx, mx):
        found = _split(cx, mx)
        if found is None:
            return None
        x, lo = found
        mn = sole_consumer(mx.outputs[0])
        if not is_op(mn, "Min") or not cx.free(mn):
            return None
        other = other_input(mn, mx.outputs[0])
        hi = cx.constant(other) if other is not None else None
        for c in (lo, hi):
            if c is not None and (c.size != 1 or cx.broadcasts_up(c, x) or c.dtype != cx.dtype(x)):
                raise Refused("a constant bound must be a scalar of x's dtype that keeps x's rank")
        if other is None:
            return None
        return Match("max_min_clip", mx, [mx, mn], "Max then Min", "Clip", data=(x, lo.reshape(()), other))

    def rewrite(self, cx, m):
        x, lo, hi = m.data
        base = m.anchor.name
        hi_c = cx.constant(hi)
        hi_v = cx.initializer(f"{base}_max", hi_c.reshape(())) if hi_c is not None else hi
        return [cx.node("Clip", [x, cx.initializer(f"{base}_min", lo), hi_v], base=f"{base}_clip")]


class Stub(Rule):
    """What the notebook ships: the learner fills in match and rewrite."""

    names = ("max_min_clip",)
    anchors = ("Max",)

    def match(self, cx, node):
        raise NotImplementedError

    def rewrite(self, cx, m):
        raise NotImplementedError


class FirstReader(MaxMinClip):
    """Not wrong here, though it looks it: takes the Max's first reader even when the Max has others. The engine
    refuses a match whose intermediate escapes the group (`engine.escapes`), so the rule needs no check of its own."""

    def match(self, cx, mx):
        found = _split(cx, mx)
        readers = [u.node for u in mx.outputs[0].uses()]
        if found is None or not readers:
            return None
        x, lo = found
        mn = readers[0]
        if not is_op(mn, "Min") or not cx.free(mn):
            return None
        other = other_input(mn, mx.outputs[0])
        hi = cx.constant(other) if other is not None else None
        if hi is None:
            return None
        for c in (lo, hi):
            if c.size != 1 or cx.broadcasts_up(c, x) or c.dtype != cx.dtype(x):
                raise Refused("the bounds must be scalars of x's dtype that keep x's rank")
        return Match("max_min_clip", mx, [mx, mn], "Max then Min", "Clip", data=(x, (lo.reshape(()), hi.reshape(()))))

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "rules"
REFERENCE = MaxMinClip
WRONG = [(ClipAnyBound, 5, "must not"), (LowerBoundOnly, 6, "upper bound of shape (4, 1, 1)"),
         (AnyUpperInput, 7, "no constant")]
STUB = Stub
