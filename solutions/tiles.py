"""The exercise of notebook 07: the UB bytes a fused group needs at a tile size (§3's rules)."""


def ub_bytes(members, tile):
    """Reference: two tiles per tensor moved through the UB (each counted once, the cube's operands not at all),
    plus the most intermediates live at any one member; a tensor smaller than a tile takes its own size."""
    moved, live = {}, []
    for pos, m in enumerate(members):
        if not m.cube:
            moved.update({("in", key): b for key, b in m.reads})
        moved.update({("out", key): b for key, b in m.writes})
        live += [(pos, last, b) for _, b, last in m.keeps]
    fixed = sum(2 * min(b, tile) for b in moved.values())
    return fixed + max(sum(min(b, tile) for s, e, b in live if s <= k <= e) for k in range(len(members)))


def ub_bytes_all_live(members, tile):
    """WRONG: every intermediate held for the whole kernel (no buffer freed after its last reader)."""
    moved = {}
    for m in members:
        if not m.cube:
            moved.update({("in", key): b for key, b in m.reads})
        moved.update({("out", key): b for key, b in m.writes})
    mids = [b for m in members for _, b, _ in m.keeps]
    return sum(2 * min(b, tile) for b in moved.values()) + sum(min(b, tile) for b in mids)


def ub_bytes_cube_in_ub(members, tile):
    """WRONG: the Conv/MatMul operands double-buffered in the UB, though they travel through L1 to the cube."""
    moved, live = {}, []
    for pos, m in enumerate(members):
        moved.update({("in", key): b for key, b in m.reads})
        moved.update({("out", key): b for key, b in m.writes})
        live += [(pos, last, b) for _, b, last in m.keeps]
    fixed = sum(2 * min(b, tile) for b in moved.values())
    return fixed + max(sum(min(b, tile) for s, e, b in live if s <= k <= e) for k in range(len(members)))


def ub_bytes_read_twice(members, tile):
    """WRONG: a tensor read by two members brought in twice."""
    fixed, live = 0, []
    for pos, m in enumerate(members):
        fixed += sum(2 * min(b, tile) for _, b in m.reads if not m.cube)
        fixed += sum(2 * min(b, tile) for _, b in m.writes)
        live += [(pos, last, b) for _, b, last in m.keeps]
    return fixed + max(sum(min(b, tile) for s, e, b in live if s <= k <= e) for k in range(len(members)))


def ub_bytes_cube_serves(members, tile):
    """WRONG: a tensor the cube reads (§2's `a`) counted once, with the cube's read, so not again for the Add that
    reads it: the cube's copy is in L1, the Add brings its own through the UB."""
    moved, live, cube_read = {}, [], set()
    for pos, m in enumerate(members):
        if m.cube:
            cube_read.update(key for key, _ in m.reads)
        else:
            moved.update({("in", key): b for key, b in m.reads if key not in cube_read})
        moved.update({("out", key): b for key, b in m.writes})
        live += [(pos, last, b) for _, b, last in m.keeps]
    fixed = sum(2 * min(b, tile) for b in moved.values())
    return fixed + max(sum(min(b, tile) for s, e, b in live if s <= k <= e) for k in range(len(members)))


def ub_bytes_stub(members, tile):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "tiles"
REFERENCE = ub_bytes
WRONG = [(ub_bytes_all_live, 0, "every intermediate counted at once"),
         (ub_bytes_cube_in_ub, 0, "the cube's operands counted in the UB"),
         (ub_bytes_read_twice, 3, "a tensor read by two ops counted twice"),
         (ub_bytes_cube_serves, 2, "a tensor the cube reads left out")]
STUB = ub_bytes_stub
