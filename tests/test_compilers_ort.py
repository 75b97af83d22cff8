"""fusionlab.compilers.ort: the kernels onnxruntime runs after its own fusions."""

from fusionlab.compilers import ort
from fusionlab.lessons import reductions as R
from fusionlab.passes import fuse


def test_layernorm_gelu_becomes_two_kernels_at_all_and_stays_six_unoptimised():
    model = R.layernorm_gelu_model(8, 16)
    assert ort.kernel_count(model, "disable") == 6
    assert ort.optimized_ops(model, "all") == {"LayerNormalization": 1, "com.microsoft:Gelu": 1}
    assert ort.kernel_count(model, "all") == 2


def test_decomposed_layernorm_is_fused_at_extended():
    model = R.layernorm_model(8, 16)
    assert ort.kernel_count(model, "disable") == 9
    assert ort.optimized_ops(model, "extended") == {"LayerNormalization": 1}


def test_op_table_puts_the_original_each_level_and_the_fused_model_side_by_side():
    model = R.layernorm_gelu_model(8, 16)
    fused = fuse(model, passes=("vertical",)).graph
    lines = ort.op_table(model, fused, levels=("disable", "all")).splitlines()
    assert lines[0].split() == ["op", "original", "ORT", "disable", "ORT", "all", "fusionlab"]
    rows = {line.split()[0]: [int(v) for v in line.split()[1:]] for line in lines[1:]}
    assert rows["total"] == [6, 6, 2, len(fused)]
    assert rows["com.microsoft:Gelu"][:3] == [0, 0, 1]
    assert sum(r[3] for op, r in rows.items() if op != "total") == len(fused)
