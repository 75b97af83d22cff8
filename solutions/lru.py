"""The first exercise of notebook 21: how many compilations a bounded cache of compiled shapes does."""

from collections import OrderedDict

from fusionlab.lessons.dynamic_shapes import shape_key


def compilations(shapes, capacity):
    """Reference: an OrderedDict in recency order; a hit moves its key to the end, a full cache drops the front."""
    held, compiled = OrderedDict(), 0
    for shape in shapes:
        key = shape_key(shape)
        if key in held:
            held.move_to_end(key)
            continue
        compiled += 1
        if capacity is not None and len(held) >= capacity:
            held.popitem(last=False)
        held[key] = True
    return compiled


def compilations_fifo(shapes, capacity):
    """WRONG: a hit does not refresh its entry, so the cache evicts the oldest compiled shape (FIFO)."""
    held, compiled = OrderedDict(), 0
    for shape in shapes:
        key = shape_key(shape)
        if key in held:
            continue
        compiled += 1
        if capacity is not None and len(held) >= capacity:
            held.popitem(last=False)
        held[key] = True
    return compiled


def compilations_spelling(shapes, capacity):
    """WRONG: keys the cache by the shape's spelling (the seed's str), so a list and a tuple are two entries."""
    held, compiled = OrderedDict(), 0
    for shape in shapes:
        key = str(shape)
        if key in held:
            held.move_to_end(key)
            continue
        compiled += 1
        if capacity is not None and len(held) >= capacity:
            held.popitem(last=False)
        held[key] = True
    return compiled


def compilations_stub(shapes, capacity):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "lru"
REFERENCE = compilations
WRONG = [(compilations_fifo, 1, "first in, first out"), (compilations_spelling, 4, "their spelling")]
STUB = compilations_stub
