"""The package's shape: no import cycles, and no imports hidden inside functions but of optional heavy packages.

Read from the source (ast), so it sees every import, also those inside functions that only run on some paths: a
cycle that only bites when a function runs first, or an internal import tucked into a function to dodge one, is
found here rather than by a user.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "fusionlab"

#: optional or heavy third-party packages a function may import where it needs them: compilers (tvm, iree, numba),
#: drawing and the notebook front end (matplotlib, ipywidgets, IPython, jupyter_server), onnxruntime's optional
#: extensions and tools, onnx's reference evaluator (only when onnxruntime lacks a float64 kernel)
OPTIONAL = {"tvm", "tvm_ffi", "iree", "numba", "matplotlib", "ipywidgets", "IPython", "jupyter_server",
            "onnxruntime_extensions", "onnxruntime.tools", "onnx.reference", "netron"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULES = _modules()


def _targets(mod: str, node: ast.AST) -> list[str]:
    """The modules an import statement of module `mod` imports (fusionlab modules resolved, others as written)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        parts = mod.split(".") if MODULES[mod].name == "__init__.py" else mod.split(".")[:-1]
        base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _imports():
    """(module, function or None, targets) for every import statement in fusionlab/."""
    for mod, path in sorted(MODULES.items()):
        tree = ast.parse(path.read_text())
        inside = {}
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    inside.setdefault(id(node), fn.name)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", None) != "__future__":
                yield mod, inside.get(id(node)), _targets(mod, node)


def _internal(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, _, targets in _imports():
        for t in targets:
            internal = _internal(t)
            # a module importing its own package's __init__ (or a parent) is how Python runs packages, not a cycle
            if internal and internal != mod and not mod.startswith(internal + "."):
                edges[mod].add(internal)
    return edges


def test_no_import_cycles():
    """Counting imports inside functions too: a cycle hidden in a function is still a cycle."""
    found = cycles(_edges())
    assert not found, found


def test_no_imports_inside_functions_but_optional_heavy_packages():
    hidden = []
    for mod, fn, targets in _imports():
        if fn is None:
            continue
        for t in targets:
            if not any(t == o or t.startswith(o + ".") for o in OPTIONAL):
                hidden.append(f"{mod}.{fn}: {t}")
    assert not hidden, "\n".join(hidden)


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"a"}, "c": {"c"}}, [["a", "b"]]),
])
def test_the_cycle_finder_finds_a_planted_cycle(edges, expected):
    assert cycles(edges) == expected


def test_no_module_is_hidden_behind_a_name_its_package_exports():
    """`fusionlab.graph.load` must be the module, not the function `load` the package exports under the same name:
    otherwise `import fusionlab.graph.load as m` hands a test or a user the function, and patching `m.X` fails (or
    patches nothing)."""
    hidden = []
    for mod in sorted(MODULES):
        if "." not in mod or mod.endswith("__main__"):  # a __main__ runs its command line when imported
            continue
        parent, leaf = mod.rsplit(".", 1)
        pkg = importlib.import_module(parent)
        importlib.import_module(mod)
        if not isinstance(getattr(pkg, leaf), type(pkg)):
            hidden.append(f"{mod} (the package's {leaf!r} is a {type(getattr(pkg, leaf)).__name__})")
    assert not hidden, hidden
