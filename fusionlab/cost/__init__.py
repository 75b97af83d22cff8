"""The cost model and everything it is made of: what a plan costs on a device, before anything runs.

- `model`: the roofline cost of a plan (FLOPs and bytes per node, kernels, peak memory); its functions are
  re-exported here (`fusionlab.cost.plan_cost`, `fusionlab.cost.compare`, ...);
- `working_set`: the tile model of a fused kernel's on-chip buffer (shared with the mixed pass);
- `schedule`: which kernels a plan launches, their order, and tensor lifetimes (`run_of`, from `model`, describes a
  model's run as that schedule sees it: what each kernel reads and writes, with the bytes);
- `devices`: the device presets (published Ascend specifications, and this machine measured);
- `calibrate`: what this machine measures (matmul GFLOP/s, streaming bandwidth, launch overhead);
- `metrics`: utilisation against the roofline, measured or modelled.
"""

from ..analysis import working_set
from . import calibrate, devices, metrics, schedule
from .model import (Analysis, CostTable, ELEMENTWISE_COST, KernelCost, NodeCost, PlanCost, VIEW_OPS, as_launched,
    compare, node_costs, one_kernel_per_group, plan_cost, predicted_speedup, run_of)

__all__ = ["Analysis", "NodeCost", "KernelCost", "PlanCost", "CostTable", "node_costs", "plan_cost", "compare",
           "predicted_speedup", "run_of", "as_launched", "one_kernel_per_group", "VIEW_OPS", "ELEMENTWISE_COST", "calibrate",
           "devices", "metrics", "working_set", "schedule"]
