"""The first exercise of notebook 15: how many fusion decisions two groupings of one graph make alike."""


def _edges(graph, *, once=True):
    """(producer, consumer) of every data edge between two non-Constant nodes."""
    out = []
    for node in graph:
        if node.op_type == "Constant":
            continue
        for v in node.inputs:
            p = v.producer() if v is not None else None
            if p is not None and p.op_type != "Constant":
                out.append((p.name, node.name))
    return list(dict.fromkeys(out)) if once else out


def _fused(groups, p, c):
    return any(p in g and c in g for g in groups)


def edges_alike(graph, groups_a, groups_b):
    """Reference: each edge once; fused when one group holds both ends."""
    edges = _edges(graph)
    alike = sum(_fused(groups_a, p, c) == _fused(groups_b, p, c) for p, c in edges)
    return alike, len(edges)


def edges_alike_per_input(graph, groups_a, groups_b):
    """WRONG: one edge per input read, so Mul(t, t) makes two edges from t."""
    edges = _edges(graph, once=False)
    alike = sum(_fused(groups_a, p, c) == _fused(groups_b, p, c) for p, c in edges)
    return alike, len(edges)


def edges_alike_any_group(graph, groups_a, groups_b):
    """WRONG: an edge counts as fused when both ends are in some group, not necessarily the same one."""
    def grouped(groups, n):
        return any(n in g for g in groups)

    edges = _edges(graph)
    alike = sum((grouped(groups_a, p) and grouped(groups_a, c)) == (grouped(groups_b, p) and grouped(groups_b, c))
                for p, c in edges)
    return alike, len(edges)


def edges_alike_group_index(graph, groups_a, groups_b):
    """WRONG: each node mapped to its group's index and the two ends compared, so two nodes in no group
    (None == None) count as fused."""
    def index(groups):
        return {n: i for i, g in enumerate(groups) for n in g}

    ia, ib = index(groups_a), index(groups_b)
    edges = _edges(graph)
    alike = sum((ia.get(p) == ia.get(c)) == (ib.get(p) == ib.get(c)) for p, c in edges)
    return alike, len(edges)


def edges_alike_stub(graph, groups_a, groups_b):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "agreement"
REFERENCE = edges_alike
WRONG = [(edges_alike_any_group, 1, "the SAME group"), (edges_alike_per_input, 2, "reading one producer twice"),
         (edges_alike_group_index, 6, "None == None")]
STUB = edges_alike_stub
