"""fusionlab.verification.precision: the float64 reference the judge measures every fused model against.

Without a reference the judge can only compare with the original, and a rounding difference the original itself
makes looks wrong (fuzz campaign 26's one `wrong`: onnx.reference's BatchNormalization_6 returned a tuple for an
opset-7 model). So the reference must run every model the generator writes, at every opset it draws.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab.build import make_model, tensor, value_info
from fusionlab.fuzz import generate
from fusionlab.verification.feeds import draws, feeds_for
from fusionlab.verification.precision import Reference, ReferenceUnavailable

RNG = np.random.default_rng(3)


def _conv_bn_model(opset: int):
    """A 1x1 Conv then BatchNormalization: onnxruntime has no float64 Conv kernel, so the reference runs on
    onnx.reference (campaign 26's repro: Pad -> Conv -> BatchNormalization -> Tanh -> Conv at opset 7)."""
    c = 3
    f = lambda *s: RNG.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [tensor("w", f(c, c, 1, 1)), tensor("g", f(c)), tensor("b", f(c)), tensor("m", f(c)),
             tensor("v", np.abs(f(c)) + np.float32(0.5))]
    nodes = [h.make_node("Conv", ["x", "w"], ["y0"]),
             h.make_node("BatchNormalization", ["y0", "g", "b", "m", "v"], ["y"], epsilon=1e-3)]
    return make_model(nodes, [value_info("x", np.float32, [2, c, 4, 4])], [value_info("y", np.float32, [2, c, 4, 4])],
                      inits, opset=opset)


@pytest.mark.parametrize("opset", [7, 8, 9, 14, 15])
def test_inference_batchnorm_has_a_float64_reference_on_onnx_reference(opset):
    m = _conv_bn_model(opset)
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    ref = Reference(m)
    got = ref.run({"x": x})["y"]
    assert ref.engine == "onnx.reference"
    init = {t.name: np.frombuffer(t.raw_data, np.float32).astype(np.float64) if t.raw_data else
            np.array(t.float_data, np.float64) for t in m.graph.initializer}
    w = init["w"].reshape(3, 3)
    g, b, mu, v = (init[k].reshape(1, 3, 1, 1) for k in "gbmv")
    eps = float(np.float32(1e-3))  # the attribute is stored as a float32
    conv = np.einsum("oc,nchw->nohw", w, x.astype(np.float64))
    want = g * (conv - mu) / np.sqrt(v + eps) + b
    assert got.dtype == np.float64 and np.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_model_the_reference_cannot_run_raises_a_named_error():
    """An op onnx.reference does not implement in a model onnxruntime cannot run in float64 either."""
    node = h.make_node("Unknown", ["x"], ["y"], domain="made.up")
    m = make_model([node], [value_info("x", np.float32, [2])], [value_info("y", np.float32, [2])], [], opset=17,
                   extra_opsets={"made.up": 1})
    with pytest.raises(ReferenceUnavailable, match="onnx.reference cannot"):
        Reference(m).run({"x": np.ones(2, np.float32)})


@pytest.mark.parametrize("start", range(0, 240, 40))
def test_the_reference_runs_every_generated_model(start):
    """The whole class: 240 generator graphs (every opset and dtype it draws), each with a float64 reference on
    its first draw. A failure names the graph."""
    failed = []
    for i in range(start, start + 40):
        model = generate(f"ref-{i}")
        d = draws(model, 1)[0]
        try:
            Reference(model).run(feeds_for(model, d))
        except ReferenceUnavailable as exc:
            failed.append(f"ref-{i} (opset {model.opset_import[0].version}): {exc}")
    assert not failed, "\n".join(failed)
