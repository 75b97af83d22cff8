"""Real compilers beside fusionlab's plan: IREE (runs fused), TVM Relax (groups), onnxruntime's own fusions; CANN ATC's
files are in `fusionlab.export.cann`.

`MODELS` names the zoo models every comparison uses (notebook 15, benchmarks/bench_compilers.py and
benchmarks/bench_tvm_agreement.py), with static shapes (batch 1) so that every compiler sees the same
graph.
"""

#: zoo model name -> builder parameters, for the compiler comparisons
MODELS = {
    "resnet_small": {"batch": 1},
    "bert_tiny": {"seq": 32, "batch": 1},
    "mobilenet_v2": {"image_size": 96, "width_mult": 0.35, "batch": 1},
    "yolov5n": {"image_size": 160, "batch": 1},
    "resnet50": {"batch": 1},
}
