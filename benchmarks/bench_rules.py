#!/usr/bin/env python3
"""Per-rule micro-benchmarks: is each vertical rule's rewrite faster than what it replaces?

A rule is on by default only if its rewrite measures faster (docs/contributing.md). Each case is
a small model holding one instance of the pattern at a realistic size; the fused model is verified against
the original, then both run interleaved at the same onnxruntime level: `disable` (the rewrite alone) and
`extended` (does onnxruntime already do it itself?). One thread, medians of paired ratios with 95% CIs.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from pathlib import Path

from common import ROOT, machine_line, markdown_table, parser, write_result

from fusionlab import timing, verify
from fusionlab.build import make_model, tensor, value_info
from fusionlab.passes import fuse
from fusionlab.passes.vertical import DEFAULT_RULES
from fusionlab.zoo import tanh_gelu


def pad_pool(op: str, size: int):
    value = 0.0 if op == "AveragePool" else -np.inf
    return make_model([helper.make_node("Pad", ["x", "pads", "v"], ["p"], mode="constant"),
                       helper.make_node(op, ["p"], ["y"], kernel_shape=[3, 3])],
                      [value_info("x", shape=[1, 64, size, size])], [value_info("y", shape=[1, 64, size, size])],
                      [tensor("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)), tensor("v", np.float32(value))],
                      opset=19)


def gelu_tanh(form: str, tokens: int, hidden: int, bias: bool):
    nodes, inits = tanh_gelu(form, "xb" if bias else "x")
    if bias:
        nodes = [helper.make_node("Add", ["x", "bias"], ["xb"])] + nodes
        inits = inits + [tensor("bias", np.linspace(-0.1, 0.1, hidden, dtype=np.float32))]
    return make_model(nodes, [value_info("x", shape=[1, tokens, hidden])],
                      [value_info("y", shape=[1, tokens, hidden])], inits, opset=17)


def skip_layernorm(tokens: int, hidden: int):
    rng = np.random.default_rng(0)
    return make_model([helper.make_node("Add", ["x", "r"], ["s"]),
                       helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-12)],
                      [value_info("x", shape=[1, tokens, hidden]), value_info("r", shape=[1, tokens, hidden])],
                      [value_info("y", shape=[1, tokens, hidden])],
                      [tensor("g", rng.standard_normal(hidden).astype(np.float32)),
                       tensor("b", rng.standard_normal(hidden).astype(np.float32))], opset=17)


def _inits(**arrays):
    return [tensor(k, v) for k, v in arrays.items()]


def sdpa_scores(b: int, heads: int, seq: int, d: int):
    """The SDPA export's scores (bert/vit/gpt2): Transpose -> Mul(d^-1/4) on Q and K, MatMul, + mask."""
    s = np.float32(d ** -0.25)
    nodes = [helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]), helper.make_node("Mul", ["qt", "s"], ["qs"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]), helper.make_node("Mul", ["kt", "s"], ["ks"]),
             helper.make_node("MatMul", ["qs", "ks"], ["a"]), helper.make_node("Add", ["a", "mask"], ["y"])]
    return make_model(nodes, [value_info("q", shape=[b, seq, heads, d]), value_info("k", shape=[b, seq, heads, d])],
                      [value_info("y", shape=[b, heads, seq, seq])],
                      _inits(s=s, mask=np.zeros([b, 1, seq, seq], np.float32)), opset=20)


def yolo_attention(heads: int, d: int, n: int):
    """YOLO11's AAttn: MatMul(Transpose(Mul(q, s)), k) -> Softmax -> MatMul(v, Transpose(p))."""
    nodes = [helper.make_node("Mul", ["q", "s"], ["qs"]), helper.make_node("Transpose", ["qs"], ["qt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qt", "k"], ["a"]), helper.make_node("Softmax", ["a"], ["p"], axis=-1),
             helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 1, 3, 2]), helper.make_node("MatMul", ["v", "pt"], ["y"])]
    ins = [value_info(k, shape=[1, heads, d, n]) for k in ("q", "k", "v")]
    return make_model(nodes, ins, [value_info("y", shape=[1, heads, d, n])], _inits(s=np.float32(d ** -0.5)), opset=20)


def residual_norm(tokens: int, hidden: int, norm: str, *, batch: int = 1, sum_read: bool = False):
    """Projection MatMul + bias + residual Add, then LayerNormalization or the decomposed (LLaMA) RMSNorm."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["h", "W"], ["p"]), helper.make_node("Add", ["p", "b"], ["pb"]),
             helper.make_node("Add", ["pb", "res"], ["s"])]
    inits = _inits(W=(rng.standard_normal([hidden, hidden]) * hidden ** -0.5).astype(np.float32),
                   b=rng.standard_normal(hidden).astype(np.float32), g=(1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
                   beta=rng.standard_normal(hidden).astype(np.float32))
    if norm == "ln":
        nodes.append(helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"], axis=-1, epsilon=1e-12))
    else:
        nodes += rmsnorm_nodes("s", "y")
        inits += _inits(two=np.float32(2.0), axes=np.array([-1], np.int64), eps=np.float32(1e-6))
    out = "y"
    if sum_read:
        nodes.append(helper.make_node("Add", ["s", "y"], ["z"]))
        out = "z"
    shape = [batch, tokens, hidden]
    return make_model(nodes, [value_info("h", shape=shape), value_info("res", shape=shape)], [value_info(out, shape=shape)],
                      inits, opset=20)


def rmsnorm_nodes(x: str, y: str):
    """LLaMA's RMSNorm: Cast, Pow, ReduceMean, Add eps, Sqrt, Reciprocal, Mul, Cast, Mul(gamma = 'g')."""
    return [helper.make_node("Cast", [x], ["xf"], to=1), helper.make_node("Pow", ["xf", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["var"]), helper.make_node("Add", ["var", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["sd"]), helper.make_node("Reciprocal", ["sd"], ["inv"]),
            helper.make_node("Mul", ["xf", "inv"], ["n"]), helper.make_node("Cast", ["n"], ["nb"], to=1),
            helper.make_node("Mul", ["g", "nb"], [y])]


def rmsnorm(tokens: int, hidden: int, batch: int = 1):
    rng = np.random.default_rng(2)
    return make_model(rmsnorm_nodes("x", "y"), [value_info("x", shape=[batch, tokens, hidden])],
                      [value_info("y", shape=[batch, tokens, hidden])],
                      _inits(two=np.float32(2.0), axes=np.array([-1], np.int64), eps=np.float32(1e-6),
                             g=(1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)), opset=23)


def cnblock_tail(b: int, s: int, c: int, *, cancel: bool):
    """ConvNeXt's block end: MatMul -> Add(b) -> Transpose -> Mul(W[C, 1, 1]) -> Add(residual) [-> Transpose -> LN].

    cancel: the residual is Transpose(LN) and the sum goes to the next LN through the inverse Transpose (the first
    block; transpose_cancel); else the residual is the block input (layer_scale)."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["hl", "W"], ["m"]), helper.make_node("Add", ["cb", "m"], ["a"]),
             helper.make_node("Transpose", ["a"], ["t"], perm=[0, 3, 1, 2]), helper.make_node("Mul", ["gamma", "t"], ["ls"])]
    inits = _inits(W=(rng.standard_normal([4 * c, c]) * (4 * c) ** -0.5).astype(np.float32),
                   cb=rng.standard_normal(c).astype(np.float32), gamma=(0.1 + rng.random([c, 1, 1])).astype(np.float32),
                   g=np.ones(c, np.float32), beta=np.zeros(c, np.float32))
    ins = [value_info("hl", shape=[b, s, s, 4 * c])]
    if cancel:
        nodes += [helper.make_node("Transpose", ["rl"], ["r"], perm=[0, 3, 1, 2]), helper.make_node("Add", ["ls", "r"], ["o"]),
                  helper.make_node("Transpose", ["o"], ["ol"], perm=[0, 2, 3, 1]),
                  helper.make_node("LayerNormalization", ["ol", "g", "beta"], ["y"], axis=-1, epsilon=1e-6),
                  helper.make_node("Conv", ["r", "wc"], ["y2"], kernel_shape=[1, 1])]
        ins.append(value_info("rl", shape=[b, s, s, c]))
        inits += _inits(wc=(rng.standard_normal([c, c, 1, 1]) * c ** -0.5).astype(np.float32))
        outs = [value_info("y", shape=[b, s, s, c]), value_info("y2", shape=[b, c, s, s])]
    else:
        nodes.append(helper.make_node("Add", ["ls", "r"], ["y"]))
        ins.append(value_info("r", shape=[b, c, s, s]))
        outs = [value_info("y", shape=[b, c, s, s])]
    return make_model(nodes, ins, outs, inits, opset=20)


def hard_act(shape, swish: bool):
    """YOLOv5's x * hardtanh(x + 3, 0, 6) / 6, or TensorFlow's hard sigmoid relu6(x + 3) / 6."""
    nodes = [helper.make_node("Add", ["x", "three"], ["t"]), helper.make_node("Clip", ["t", "zero", "six"], ["c"])]
    nodes += [helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"])] if swish else \
        [helper.make_node("Div", ["c", "six"], ["y"])]
    return make_model(nodes, [value_info("x", shape=list(shape))], [value_info("y", shape=list(shape))],
                      _inits(three=np.float32(3), zero=np.float32(0), six=np.float32(6)), opset=20)


def se_gate(c: int, size: int):
    """A TF-style squeeze-excitation gate: GlobalAveragePool -> Conv 1x1 -> relu6(x + 3) / 6 -> Mul(features)."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Conv", ["p", "w", "b"], ["cv"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["cv", "three"], ["t"]), helper.make_node("Clip", ["t", "zero", "six"], ["cl"]),
             helper.make_node("Div", ["cl", "six"], ["gate"]), helper.make_node("Mul", ["x", "gate"], ["y"])]
    return make_model(nodes, [value_info("x", shape=[1, c, size, size])], [value_info("y", shape=[1, c, size, size])],
                      _inits(w=(rng.standard_normal([c, c, 1, 1]) * c ** -0.5).astype(np.float32),
                             b=rng.standard_normal(c).astype(np.float32), three=np.float32(3), zero=np.float32(0),
                             six=np.float32(6)), opset=20)


def chunk2(shape):
    """TorchScript's x.chunk(2, 1): two Slices (starts/ends computed from the shape, folded to constants)."""
    half = shape[1] // 2
    nodes = [helper.make_node("Slice", ["x", "z", "h", "one"], ["a"]), helper.make_node("Slice", ["x", "h", "big", "one"], ["b"]),
             helper.make_node("Sub", ["b", "a"], ["y"])]
    return make_model(nodes, [value_info("x", shape=list(shape))],
                      [value_info("y", shape=[shape[0], half, *shape[2:]])],
                      _inits(z=np.array([0], np.int64), h=np.array([half], np.int64), one=np.array([1], np.int64),
                             big=np.array([np.iinfo(np.int64).max], np.int64)), opset=20)


def rope(b: int, heads: int, seq: int, d: int):
    """LLaMA's q and k through rotate_half (x * cos + cat(-x2, x1) * sin), the [1, 1, S, D] tables constant (what a
    static export folds them to), the rotated heads handed to attention ([B, N, S, D])."""
    ang = np.arange(seq)[:, None] * (1.0 / 10000.0 ** (np.arange(0, d, 2) / d))[None, :]
    emb = np.concatenate([ang, ang], -1).reshape(1, 1, seq, d)
    nodes = []
    for x in ("q", "k"):
        nodes += [helper.make_node("Slice", [x, "z", "h", "ax"], [f"{x}1"]), helper.make_node("Slice", [x, "h", "big", "ax"], [f"{x}2"]),
                  helper.make_node("Neg", [f"{x}2"], [f"{x}n"]), helper.make_node("Concat", [f"{x}n", f"{x}1"], [f"{x}r"], axis=-1),
                  helper.make_node("Mul", [x, "cos"], [f"{x}c"]), helper.make_node("Mul", [f"{x}r", "sin"], [f"{x}s"]),
                  helper.make_node("Add", [f"{x}c", f"{x}s"], [f"{x}_rot"])]
    shape = [b, heads, seq, d]
    return make_model(nodes, [value_info(x, shape=shape) for x in ("q", "k")], [value_info(f"{x}_rot", shape=shape) for x in ("q", "k")],
                      _inits(z=np.array([0], np.int64), h=np.array([d // 2], np.int64), ax=np.array([3], np.int64),
                             big=np.array([np.iinfo(np.int64).max], np.int64), cos=np.cos(emb).astype(np.float32),
                             sin=np.sin(emb).astype(np.float32)), opset=20)


def cases(quick: bool) -> list[tuple[str, tuple[str, ...], str, object]]:
    """(rule, rules to fuse with, what, model): one instance of each pattern at the corpus' size and a full one."""
    size, tokens, hidden = (28, 32, 256) if quick else (56, 128, 768)
    heads = hidden // 64
    out = [
        ("pad_pool", ("pad_pool",), f"Pad + AveragePool, 1x64x{size}x{size}", pad_pool("AveragePool", size)),
        ("pad_pool", ("pad_pool",), f"Pad(-inf) + MaxPool, 1x64x{size}x{size}", pad_pool("MaxPool", size)),
        ("fast_gelu", ("fast_gelu",), f"tanh-GELU (Pow form), 1x{tokens}x{hidden}", gelu_tanh("pow", tokens, hidden, False)),
        ("fast_gelu", ("fast_gelu",), f"bias + tanh-GELU (onnxruntime's form), 1x{tokens}x{hidden}",
         gelu_tanh("ort", tokens, hidden, True)),
        ("skip_layernorm", ("skip_layernorm",), f"Add + LayerNormalization, 1x{tokens}x{hidden}", skip_layernorm(tokens, hidden)),
    ]
    for b, seq, hid, hd in ((3, 11, 128, 4), (1, tokens, hidden, heads)):
        where = f"{b}x{seq}x{hid}" + (" (corpus bert)" if b == 3 else "")
        out += [
            ("fused_matmul", ("fused_matmul",), f"SDPA scores: Q, K scaled by d^-1/4, {b}x{hd}x{seq}x{seq}",
             sdpa_scores(b, hd, seq, hid // hd)),
            ("skip_layernorm", ("skip_layernorm",), f"MatMul + bias + residual + LayerNorm, {where}",
             residual_norm(seq, hid, "ln", batch=b)),
            ("skip_layernorm", ("skip_layernorm",), f"... pre-LN, the sum read again, {where}",
             residual_norm(seq, hid, "ln", batch=b, sum_read=True)),
            ("rmsnorm", ("rmsnorm",), f"LLaMA RMSNorm (Cast, Pow, ..., Mul), {where}, opset 23", rmsnorm(seq, hid, b)),
            ("skip_rmsnorm", ("skip_rmsnorm",), f"MatMul + bias + residual + RMSNorm, {where}",
             residual_norm(seq, hid, "rms", batch=b)),
        ]
    out.append(("fused_matmul", ("fused_matmul",), "YOLO11 attention, 1x1x32x25 (corpus)", yolo_attention(1, 32, 25)))
    out.append(("fused_matmul", ("fused_matmul",), "YOLO11 attention, 1x2x64x400", yolo_attention(2, 64, 400)))
    for b, s, c, tag in ((3, 24, 16, " (corpus convnext)"), (1, 56, 96, " (ConvNeXt-T stage 1)")):
        out.append(("layer_scale", ("layer_scale",), f"MatMul + bias, Transpose, Mul(gamma), {b}x{s}x{s}x{c}{tag}",
                    cnblock_tail(b, s, c, cancel=False)))
        out.append(("transpose_cancel", ("transpose_cancel",), f"Transpose, Mul, Add(Transpose), Transpose, "
                    f"{b}x{s}x{s}x{c}{tag}", cnblock_tail(b, s, c, cancel=True)))
        out.append(("transpose_cancel", ("transpose_cancel", "layer_scale"), f"... with layer_scale: the Mul folds too, "
                    f"{b}x{s}x{s}x{c}{tag}", cnblock_tail(b, s, c, cancel=True)))
    for shape, tag in (((3, 8, 48, 48), " (corpus mobilenetv3)"), ((1, 16, 112, 112), "")):
        dims = "x".join(map(str, shape))
        out.append(("hard_swish", ("hard_swish",), f"x * clip(x + 3, 0, 6) / 6, {dims}{tag}", hard_act(shape, True)))
        out.append(("hard_sigmoid", ("hard_sigmoid",), f"clip(x + 3, 0, 6) / 6, {dims}{tag}", hard_act(shape, False)))
    out.append(("slice_split", ("slice_split",), "chunk(2, 1) as two Slices, 1x4x525 (corpus yolo11)", chunk2((1, 4, 525))))
    out.append(("slice_split", ("slice_split",), "chunk(2, 1) as two Slices, 1x128x80x80", chunk2((1, 128, 80, 80))))
    out.append(("rotary", ("rotary",), "LLaMA rotate_half on q, k, 3x4x11x16 (corpus llama)", rope(3, 4, 11, 16)))
    out.append(("rotary", ("rotary",), f"LLaMA rotate_half on q, k, 1x32x{tokens * 4}x128 (LLaMA-7B heads)",
                rope(1, 32, tokens * 4, 128)))
    out.append(("hard_sigmoid", ("conv_act", "hard_sigmoid"), "SE gate: Conv 1x1 + clip(x + 3, 0, 6) / 6 -> FusedConv, "
                "1x96x14x14", se_gate(96, 14)))
    return out


def _cell(model_a, model_b, level: str, min_time: float, dims=None) -> str:
    c = timing.compare_models(model_a, model_b, level_a=level, level_b=level, min_time=min_time, dims=dims,
                              label_a="original", label_b="fused")
    return f"{c.speedup:.2f}x ({c.ci_low:.2f}-{c.ci_high:.2f})"


def micro_rows(quick: bool, min_time: float) -> list[list[str]]:
    rows = []
    for rule, rules, what, model in cases(quick):
        fused = fuse(model, passes=("vertical",), rules=rules)
        assert set(fused.plan.rule_counts()) & set(rules), (rule, fused.plan.rule_counts())
        report = verify(model, fused.graph)
        assert report.ok, report.table()
        cells = [_cell(model, fused.graph, level, min_time) for level in ("disable", "extended")]
        ops = ", ".join(f"{k}x{v}" if v > 1 else k for k, v in fused.after.items())
        rows.append([rule, "yes" if rule in DEFAULT_RULES else "no (opt-in)", what, ops, *cells])
    return rows


#: the rules this benchmark measures on the corpus models (each against the rest of the defaults)
CORPUS_RULES = [(("fused_matmul",), ("bert.dynamo", "bert.ts-fold", "gpt2.dynamo", "vit.dynamo", "yolo11.dynamo")),
                (("skip_layernorm",), ("bert.dynamo", "gpt2.dynamo", "vit.dynamo")),
                (("layer_scale",), ("convnext.dynamo", "convnext.ts-fold")),
                (("transpose_cancel",), ("convnext.dynamo", "convnext.ts-fold")),
                (("transpose_cancel", "layer_scale"), ("convnext.dynamo", "convnext.ts-fold")),
                (("rotary",), ("llama.dynamo", "llama.ts-fold", "llama.ts-nofold"))]
#: the dims the corpus survey runs at (docs/corpus.md)
CORPUS_DIMS = {"batch": 3, "sequence": 11}


def corpus_rows(folder: Path, min_time: float) -> list[list[str]]:
    """Each rule on whole corpus models: the defaults without it (A) vs with it (B), the model's own shapes."""
    rows = []
    measured = {r for rules, _ in CORPUS_RULES for r in rules}
    base = tuple(r for r in DEFAULT_RULES if r not in measured)
    for rules, names in CORPUS_RULES:
        for name in names:
            path = folder / f"{name}.onnx"
            if not path.exists():
                continue
            a = fuse(str(path), passes=("vertical",), rules=base)
            b = fuse(str(path), passes=("vertical",), rules=base + rules)
            n = sum(b.plan.rule_counts().get(r, 0) for r in rules)
            assert n and verify(str(path), b.graph, dims=CORPUS_DIMS).ok, (rules, name)
            cells = [_cell(a.graph, b.graph, level, min_time, CORPUS_DIMS) for level in ("disable", "extended")]
            rows.append([" + ".join(rules), name, f"{n}", f"{len(a.graph)} -> {len(b.graph)}", *cells])
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests" / "corpus", help="folder of the export corpus")
    args = ap.parse_args()
    min_time = args.min_time or (0.2 if args.quick else 2.0)
    rows = micro_rows(args.quick, min_time)
    text = "# Vertical rules one by one: rewrite vs the ops it replaces\n\n" + markdown_table(
        ["rule", "on by default", "pattern", "fused to", "speedup, optimisations off (95% CI)",
         "speedup, both at onnxruntime EXTENDED (95% CI)"], rows) + (
        "\n\nSpeedup = original time / fused time, median of paired interleaved runs, one thread; every fused "
        "model verified first. Under EXTENDED a ratio near 1 means onnxruntime already makes the same fusion "
        "itself; above 1, fusionlab's rewrite finds what onnxruntime's pattern does not." +
        (" (--quick: a smoke test, not a result)" if args.quick else ""))
    crows = corpus_rows(args.corpus, min_time) if args.corpus.is_dir() else []
    if crows:
        text += ("\n\n**The same rules on the export corpus' models, at their own shapes (batch 3, sequence 11).** "
                 "A = the model fused with the default rules minus the measured ones, B = A's rules plus the rule(s) of the row; "
                 "speedup = time(A) / time(B), both at the same onnxruntime level.\n\n" + markdown_table(
                     ["rule", "model", "groups", "nodes A -> B", "speedup, optimisations off (95% CI)",
                      "speedup, both at EXTENDED (95% CI)"], crows))
    text += "\n\n" + machine_line() + ". The machine is shared with other jobs: figures are noisy; ratios are paired."
    write_result("rules.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
