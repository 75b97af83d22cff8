"""What leaves the package: a fused group as a custom operator (declared REG_OP style, run in onnxruntime) and the
files a developer takes to an Ascend machine.

- `declare`: `reg_op(...)` builder, the three validation rules, shape/type inference.
- `from_group`: a fusion-plan group -> declaration + the model rewritten to use the op.
- `kernels`: the numpy kernel and its onnxruntime-extensions registration.
- `cann`: op_proto, msopgen JSON, Ascend C project, ONNX plugin, atc command, fusion_switch.cfg; and the plan as
  ATC reports it (fusion_result.json, a --fusion_switch_file).
"""

from .cann import package_files, write_package
from .declare import DeclarationError, OpDecl, name_for, problems, reg_op, validate
from .from_group import CustomOp, CustomOpResult, UnsupportedGroup, declare_group, replace_groups
from .kernels import compute, library_path, register

__all__ = ["DeclarationError", "OpDecl", "reg_op", "validate", "problems", "name_for", "CustomOp", "CustomOpResult",
           "UnsupportedGroup", "declare_group", "replace_groups", "compute", "library_path", "register",
           "package_files", "write_package"]
