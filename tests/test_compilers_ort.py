"""fusionlab.compilers.ort: the kernels onnxruntime runs after its own fusions."""

from fusionlab.compilers import ort
from fusionlab.lessons import reductions as R


def test_layernorm_gelu_becomes_two_kernels_at_all_and_stays_six_unoptimised():
    model = R.layernorm_gelu_model(8, 16)
    assert ort.kernel_count(model, "disable") == 6
    assert ort.optimized_ops(model, "all") == {"LayerNormalization": 1, "com.microsoft:Gelu": 1}
    assert ort.kernel_count(model, "all") == 2


def test_decomposed_layernorm_is_fused_at_extended():
    model = R.layernorm_model(8, 16)
    assert ort.kernel_count(model, "disable") == 9
    assert ort.optimized_ops(model, "extended") == {"LayerNormalization": 1}
