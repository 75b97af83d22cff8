"""The exercise of notebook 06: the immediate post-dominator of every node of a DAG."""


def post_dominators(consumers, outputs):
    """Reference: notebook 06 §3's sweep. From the end backwards, a node's post-dominator is the lowest common
    ancestor, in the tree built so far, of all its consumers; a node whose result leaves the graph (a graph output, or
    no consumers) has none, and a consumer with none makes the whole answer None."""
    parent, depth = {}, {}
    for node in reversed(list(consumers)):
        users = consumers[node]
        if node in outputs or not users:
            parent[node], depth[node] = None, 1
            continue
        lca = users[0]
        for other in users[1:]:
            a, b = lca, other
            while a != b and a is not None and b is not None:
                if depth[a] > depth[b]:
                    a = parent[a]
                elif depth[b] > depth[a]:
                    b = parent[b]
                else:
                    a, b = parent[a], parent[b]
            lca = a if a == b else None
            if lca is None:
                break
        parent[node] = lca
        depth[node] = 1 if lca is None else depth[lca] + 1
    return parent


def post_dominators_one_consumer(consumers, outputs):
    """WRONG: a node's post-dominator is its consumer when it has one, else nothing (misses every diamond)."""
    return {n: (users[0] if len(users) == 1 and n not in outputs else None) for n, users in consumers.items()}


def post_dominators_ignore_outputs(consumers, outputs):
    """WRONG: forgets that a result which is a graph output leaves the graph even when it is read further."""
    return post_dominators(consumers, set())


def post_dominators_first_meeting(consumers, outputs):
    """WRONG: takes the first node (in topological order) that every consumer's paths reach, ignoring paths that
    reach it from only some consumers: a shortcut past it is missed."""
    order = list(consumers)

    def below(n):
        seen, stack = {n}, [n]
        while stack:
            for c in consumers[stack.pop()]:
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
        return seen

    out = {}
    for n, users in consumers.items():
        common = set.intersection(*(below(u) for u in users)) if users and n not in outputs else set()
        out[n] = min(common, key=order.index) if common else None
    return out


def post_dominators_stub(consumers, outputs):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "postdom"
REFERENCE = post_dominators
WRONG = [(post_dominators_one_consumer, 1, "every path from relu"),
         (post_dominators_ignore_outputs, 4, "graph output"),
         (post_dominators_first_meeting, 6, "does not pass d")]
STUB = post_dominators_stub
