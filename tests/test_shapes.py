"""Static shapes and byte counts for every intermediate value."""

import numpy as np

from fusionlab import load, zoo
from fusionlab.shapes import infer_shapes, nbytes


def test_every_bert_intermediate_gets_a_shape_and_dtype():
    g = load(zoo.bert(layers=1, hidden=32, heads=2, intermediate=64, vocab=50))
    shapes = infer_shapes(g, dims={"batch": 2, "sequence": 5})
    outs = [v for n in g for v in n.outputs]
    assert all(v.name in shapes for v in outs), [v.name for v in outs if v.name not in shapes][:5]
    last = g.outputs()[0]
    assert shapes[last.name] == (2, 5, 32)
    assert shapes.dtypes[last.name] == np.float32
    assert nbytes(last, shapes) == 2 * 5 * 32 * 4


def test_bound_dims_change_byte_counts_and_graph_is_untouched():
    g = load(zoo.conv_bn_relu(3, 8, 3, image_size=16))
    before = g.to_proto().SerializeToString()
    conv_out = next(n for n in g if n.op_type == "Conv").outputs[0]
    one = nbytes(conv_out, infer_shapes(g, dims={"batch": 1}))
    four = nbytes(conv_out, infer_shapes(g, dims={"batch": 4}))
    assert one and four == 4 * one
    assert g.to_proto().SerializeToString() == before
