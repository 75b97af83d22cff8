"""The cost model and everything it is made of: what a plan costs on a device, before anything runs.

- `model`: the roofline cost of a plan (FLOPs and bytes per node, kernels, peak memory); its functions are
  re-exported here (`fusionlab.cost.plan_cost`, `fusionlab.cost.compare`, ...);
- `devices`: the device presets (published Ascend specifications, and this machine measured);
- `calibrate`: what this machine measures (matmul GFLOP/s, streaming bandwidth, launch overhead);
- `metrics`: utilisation against the roofline, measured or modelled.
"""

from . import calibrate, devices
from .model import (ELEMENTWISE_COST, VIEW_OPS, Analysis, CostTable, KernelCost, NodeCost, PlanCost, compare, node_costs,
                    plan_cost, predicted_speedup)
from . import metrics  # noqa: E402  (metrics reads the model)

__all__ = ["Analysis", "NodeCost", "KernelCost", "PlanCost", "CostTable", "node_costs", "plan_cost", "compare",
           "predicted_speedup", "VIEW_OPS", "ELEMENTWISE_COST", "calibrate", "devices", "metrics"]
