"""The exercises of notebooks 05 (qkv, siblings) and 06 (postdom): their truth is the lesson's own code (onnxruntime,
horizontal.plan, mixed.post_dominator_tree), near-miss answers fail, and every hint explains itself."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fusionlab import zoo
from fusionlab.analysis import derive
from fusionlab.exercises import core, postdom, qkv, siblings
from fusionlab.graph import load
from fusionlab.passes import horizontal, mixed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import postdom as s_postdom  # noqa: E402
from solutions import qkv as s_qkv  # noqa: E402
from solutions import siblings as s_siblings  # noqa: E402


def _lines_ok(v):
    assert all(len(line) <= 110 for line in str(v).splitlines()), str(v)


# -- qkv (notebook 05, exercise 1) --------------------------------------------------------------------------------

def test_qkv_the_lessons_own_concatenation_passes():
    """derive.concat_matmul_weights, the function the pass and §1 use, answers the exercise."""
    def with_derive(Wq, bq, Wk, bk, Wv, bv):
        return derive.concat_matmul_weights([Wq, Wk, Wv], [bq, bk, bv])

    assert qkv.check(with_derive).ok


def test_qkv_is_graded_by_onnxruntime_not_by_the_formula():
    def slightly_off(*args):
        w, b, split = s_qkv.fuse_qkv(*args)
        return w * w.dtype.type(1.001), b, split

    v = qkv.check(slightly_off)
    assert v.status == core.FAIL and "differs from onnxruntime's Q projection" in v.hint
    _lines_ok(v)


def test_qkv_keeps_the_dtype_and_names_a_float64_bias():
    def zeros_f64(Wq, bq, Wk, bk, Wv, bv):
        w, _, split = s_qkv.fuse_qkv(Wq, bq, Wk, bk, Wv, bv)
        return w, np.concatenate([np.zeros(n) if b is None else b for n, b in zip(split, (bq, bk, bv))]), split

    v = qkv.check(zeros_f64)  # float32 biases + float64 zeros -> float64: right values, wrong dtype
    missing = next(i for i, c in enumerate(qkv.CASES) if not all(c.data.bias))
    assert v.passed == missing and "np.zeros makes float64" in v.hint
    fp16 = next(i for i, c in enumerate(qkv.CASES) if c.data.dtype == "float16")

    def to_f32(*args):
        w, b, split = s_qkv.fuse_qkv(*args)
        return w.astype(np.float32), None if b is None else b.astype(np.float32), split

    v = qkv.check(to_f32)
    assert v.passed == fp16 and "the model is float16" in v.hint


def test_qkv_a_block_order_mistake_is_caught_by_the_outputs():
    def k_first(Wq, bq, Wk, bk, Wv, bv):
        return s_qkv.fuse_qkv(Wk, bk, Wq, bq, Wv, bv)

    v = qkv.check(k_first)  # equal widths in case 1: shapes fit, the values do not
    assert v.passed == 0 and "in the order Q, K, V" in v.hint


def test_qkv_cases_hold_the_hard_corners():
    data = [c.data for c in qkv.CASES]
    assert any(len(set(d.widths)) > 1 for d in data)  # K/V narrower than Q
    assert any(not any(d.bias) for d in data) and any(any(d.bias) and not all(d.bias) for d in data)
    assert any(d.dtype == "float16" for d in data)


# -- siblings (notebook 05, exercise 2) ---------------------------------------------------------------------------

def test_siblings_truth_is_the_plan_and_every_case_is_explained():
    positives = negatives = 0
    for i, case in enumerate(siblings.CASES):
        g = load(siblings.build(case.data), check=False)
        groups = [set(grp.nodes) for grp in horizontal.plan(g)]
        for (a, b), together in siblings.truth(i).items():
            assert together == any({a, b} <= grp for grp in groups)
            explained = siblings.why(i, a, b)
            assert explained.startswith("the pass stacks them") == together, explained
            assert "sibling keys differ" not in explained  # every refusal found its words
            positives, negatives = positives + together, negatives + (not together)
    assert positives >= 5 and negatives >= 5


def test_siblings_each_description_is_the_node_the_pass_sees():
    for case in siblings.CASES:
        g = load(siblings.build(case.data), check=False)
        nodes = {n.name: n for n in g}
        for s in case.data.siblings:
            n = nodes[s.name]
            assert n.op_type == s.op and n.inputs[0].name == s.reads
            assert {k: a.value if isinstance(a.value, int) else list(a.value)
                    for k, a in n.attributes.items()} == s.attrs
            assert (n.inputs[1].const_value is None) == (s.weight is None)


def test_siblings_a_yes_to_everything_fails_on_the_first_near_miss_with_the_pass_reason():
    v = siblings.check(lambda a, b: True)
    first_miss = next(i for i in range(len(siblings.CASES)) if not all(siblings.truth(i).values()))
    assert v.passed == first_miss and "strides" in v.hint
    _lines_ok(v)
    v = siblings.check(lambda a, b: a.op == b.op == "Conv" or a.op == b.op == "MatMul")
    assert "the pass refuses" in v.hint or "differ" in v.hint


def test_siblings_a_width_check_is_named_as_the_mistake():
    v = siblings.check(s_siblings.can_stack_same_weight_shape)
    assert "grouped-query" in v.failed_case and "the wide op stacks any widths" in v.hint


def test_siblings_answer_must_be_a_bool():
    v = siblings.check(lambda a, b: "yes")
    assert v.status == core.FAIL and "True or False" in v.hint


# -- postdom (notebook 06, exercise 2) ----------------------------------------------------------------------------

def test_postdom_reference_is_the_pass_on_a_real_model():
    """On BERT-tiny (and notebook 06's own kind of graph) the reference sweep gives the pass's tree: the exercise
    asks for the algorithm the pass runs, not for an approximation that happens to fit eight small DAGs."""
    g = load(zoo.get("bert_tiny"))
    consumers, outputs = postdom.as_dag(g)
    tree = mixed.post_dominator_tree(g)
    assert s_postdom.post_dominators(consumers, outputs) == tree
    assert sum(p is not None for p in tree.values()) > len(tree) // 2


def test_postdom_every_case_matters():
    """Each hidden DAG is built as the model the pass sees, and each planted mistake passes some cases first."""
    for i, case in enumerate(postdom.CASES):
        consumers, outputs = case.data
        assert list(postdom.truth(i)) == list(consumers)
        assert postdom.as_dag(load(postdom.build(consumers, outputs))) == (consumers, set(outputs))
    for answer, index, _ in s_postdom.WRONG:
        assert postdom.check(answer).passed == index > 0


def test_postdom_hints_show_a_path_that_really_avoids_the_answer():
    v = postdom.check(s_postdom.post_dominators_first_meeting)
    consumers, _ = postdom.CASES[v.passed].data
    path = v.hint.split("the path ")[1].split(" (a graph output)")[0].split(" -> ")
    assert all(b in consumers[a] for a, b in zip(path, path[1:])) and "d" not in path
    _lines_ok(v)
    v = postdom.check(lambda c, o: {n: None for n in c})
    assert v.passed == 0 and "every path from" in v.hint
    v = postdom.check(lambda c, o: [])
    assert v.status == core.FAIL and "must return a dict" in v.hint
