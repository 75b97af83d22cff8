"""CANN artifacts generated from a declaration: files a developer takes to an Ascend machine.

Everything is deterministic (same declaration -> byte-identical files) and follows the formats in
the public CANN sources: `REG_OP` prototypes (metadef `graph/operator_reg.h`, the samples'
`op_proto/*.h/.cc`), msopgen's JSON input (`op`, `language`, `input_desc`, `output_desc`, `attr`),
the Ascend C project that `msopgen -lan cpp` lays out (`op_host/`, `op_kernel/`, `framework/`,
`CMakePresets.json`, `build.sh`), an ONNX parser plugin (`REGISTER_CUSTOM_OP(...).FrameworkType(ONNX)`),
`atc --framework=5` and a `fusion_switch.cfg`. The kernel and tiling bodies are stubs marked
`TO WRITE ON THE DEVICE`: fusionlab cannot compile or test Ascend C here.

The plan in CANN ATC's own files: ``fusion_result.json`` and a ``--fusion_switch_file``.

ATC decides fusion in two stages (cann_facts.md section 6): **graph fusion** passes rewrite the graph
(fold BatchNorm into a Conv's weights, MatMul + BiasAdd into one op...), then **UB fusion** passes merge
ops whose intermediate would otherwise travel Unified Buffer → global memory → Unified Buffer into one
kernel (typically a Conv or MatMul with its elementwise epilogue). Every built-in pass is on by
default; a ``--fusion_switch_file`` can only turn passes off. After a conversion ATC writes
``fusion_result.json``, which counts, per pass, how often its pattern matched and how often it took
effect::

    {"graph_fusion": {"ConvBatchnormFusionPass": {"effect_times": "2", "match_times": "2"}},
     "session_and_graph_id": "0_0",
     "ub_fusion": {"TbeCommonRules0FusionPass": {"effect_times": "2", "match_times": "2"}}}

`fusion_result` writes a FusionPlan in exactly that format. Each fusionlab rule is filed under the
real ATC pass that does the same fusion where one is documented (`ATC_PASSES`); rules with no
documented ATC counterpart are filed under a name that starts with ``Fusionlab`` so nobody mistakes
them for ATC passes. Counts are strings, as ATC writes them. A plan holds only the groups that were
formed, so ``match_times`` equals ``effect_times``: fusionlab does not record the candidates its
legality checks refused in a form that maps onto ATC's patterns.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from ..files import atomic_write, default_mode
from .declare import DTYPES, OpDecl, cpp_value

__all__ = ["snake", "proto_header", "proto_source", "msopgen_json", "onnx_plugin",
           "op_host", "op_tiling", "op_kernel", "kernel_pipeline", "has_fixpipe", "CUBE_OPS", "cmake_presets",
           "build_sh", "cmakelists", "atc_command",
           "fusion_switch_cfg", "readme", "package_files", "write_package", "STUB_MARK", "MSOPGEN_ATTR_TYPES", "ATC_PASSES", "fusion_result", "fusion_result_json", "read_fusion_result", "fusion_switch", "pass_for"]

STUB_MARK = "TO WRITE ON THE DEVICE"

#: CANN attr token -> msopgen JSON attr type (listInt/int/float/bool as in msopgen's .ini and JSON files)
MSOPGEN_ATTR_TYPES = {"Int": "int", "Float": "float", "Bool": "bool", "String": "str", "ListInt": "listInt",
                      "ListFloat": "listFloat", "ListBool": "listBool", "ListString": "listStr"}
_CPP_ATTR = {"Int": "int64_t", "Float": "float", "Bool": "bool", "String": "std::string",
             "ListInt": "std::vector<int64_t>", "ListFloat": "std::vector<float>", "ListBool": "std::vector<bool>",
             "ListString": "std::vector<std::string>"}
_PARAM = {"required": "REQUIRED", "optional": "OPTIONAL", "dynamic": "DYNAMIC"}


def snake(name: str) -> str:
    """CANN file-name form of an op name: ConvRelu -> conv_relu, Conv2DTik -> conv2d_tik."""
    s = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name)
    s = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", s)
    return s.lower()


def _uses_conv(decl: OpDecl) -> bool:
    return any(s.op == "Conv" for s in decl.body)


def _format(decl: OpDecl, name: str) -> str:
    """Data format of a tensor: NCHW for a conv op's 4-D tensors, ND otherwise."""
    if _uses_conv(decl) and name in ("x", "filter", "y"):
        return "NCHW"
    return "ND"


# --------------------------------------------------------------------------------------------------
# op_proto: REG_OP header and the infer-shape / verify registrations
# --------------------------------------------------------------------------------------------------

def _provenance(decl: OpDecl) -> list[str]:
    lines = [f"Fused from ONNX ops: {' + '.join(decl.fused)}."]
    if decl.folded:
        lines.append(f"Folded into the weights at conversion time: {', '.join(decl.folded)}.")
    body = "; ".join(f"{s.output} = {s.op}({', '.join(s.inputs)})" for s in decl.body)
    lines.append(f"Computes: {body}")
    return lines


def proto_header(decl: OpDecl) -> str:
    """`op_proto/<op>.h`: the REG_OP prototype."""
    guard = f"GE_OP_{snake(decl.name).upper()}_H"
    doc = "\n".join(f" * {l}" for l in _provenance(decl))
    return (f"/* Generated by fusionlab from a fusion group. Do not edit: regenerate.\n{doc}\n */\n"
            f"#ifndef {guard}\n#define {guard}\n#include \"graph/operator_reg.h\"\n\nnamespace ge {{\n"
            f"{decl.reg_op()}\n}}  // namespace ge\n#endif  // {guard}\n")


def _infer_body(decl: OpDecl) -> str:
    """C++ body of the infer function: Conv2D formula for conv ops, shape of x for element-wise ones."""
    first = decl.inputs[0].name
    if _uses_conv(decl):
        return """  auto x_dims = op.GetInputDescByName("x").GetShape().GetDims();
  auto w_dims = op.GetInputDescByName("filter").GetShape().GetDims();
  std::vector<int64_t> strides, pads, dilations;
  if (op.GetAttr("strides", strides) != GRAPH_SUCCESS || op.GetAttr("pads", pads) != GRAPH_SUCCESS) {
    return GRAPH_FAILED;
  }
  if (op.GetAttr("dilations", dilations) != GRAPH_SUCCESS) {
    dilations = {1, 1, 1, 1};
  }
  if (x_dims.size() != 4 || w_dims.size() != 4 || strides.size() != 4 || pads.size() != 4 ||
      dilations.size() != 4) {
    return GRAPH_FAILED;
  }
  // NCHW; pads are (top, bottom, left, right), as for the built-in Conv2D
  int64_t oh = (x_dims[2] + pads[0] + pads[1] - (dilations[2] * (w_dims[2] - 1) + 1)) / strides[2] + 1;
  int64_t ow = (x_dims[3] + pads[2] + pads[3] - (dilations[3] * (w_dims[3] - 1) + 1)) / strides[3] + 1;
  std::vector<int64_t> y_dims = {x_dims[0], w_dims[0], oh, ow};
  TensorDesc y_desc = op.GetOutputDescByName("y");
  y_desc.SetShape(ge::Shape(y_dims));
  y_desc.SetDataType(op.GetInputDescByName("x").GetDataType());
  (void)op.UpdateOutputDesc("y", y_desc);
  return GRAPH_SUCCESS;"""
    return f"""  // element-wise chain: y has the shape and type of {first} (other operands broadcast into it)
  auto x_shape = op.GetInputDescByName("{first}").GetShape().GetDims();
  DataType x_dtype = op.GetInputDescByName("{first}").GetDataType();
  TensorDesc y_desc = op.GetOutputDescByName("y");
  y_desc.SetShape(ge::Shape(x_shape));
  y_desc.SetDataType(x_dtype);
  (void)op.UpdateOutputDesc("y", y_desc);
  return GRAPH_SUCCESS;"""


def _verify_body(decl: OpDecl) -> str:
    first = decl.inputs[0].name
    lines = [f"  DataType x_dtype = op.GetInputDescByName(\"{first}\").GetDataType();"]
    for t in decl.inputs[1:]:
        if t.name == "bias" and t.param_type == "optional":
            continue
        lines.append(f"  if (op.GetInputDescByName(\"{t.name}\").GetDataType() != x_dtype) {{\n"
                     f"    return GRAPH_FAILED;\n  }}")
    for a in decl.attrs:
        if a.type == "ListInt" and a.name in ("strides", "pads", "dilations"):
            lines.append(f"  std::vector<int64_t> {a.name};\n"
                         f"  if (op.GetAttr(\"{a.name}\", {a.name}) == GRAPH_SUCCESS && {a.name}.size() != 4) {{\n"
                         f"    return GRAPH_FAILED;\n  }}")
    lines.append("  return GRAPH_SUCCESS;")
    return "\n".join(lines)


def proto_source(decl: OpDecl) -> str:
    """`op_proto/<op>.cc`: IMPLEMT_INFERFUNC / IMPLEMT_VERIFIER and their registrations."""
    n = decl.name
    return (f"/* Generated by fusionlab. Shape inference mirrors fusionlab's OpDecl.infer. */\n"
            f"#include \"{snake(n)}.h\"\n#include <vector>\n\nnamespace ge {{\n"
            f"IMPLEMT_INFERFUNC({n}, {n}InferShape) {{\n{_infer_body(decl)}\n}}\n\n"
            f"IMPLEMT_VERIFIER({n}, {n}Verify) {{\n{_verify_body(decl)}\n}}\n\n"
            f"INFER_FUNC_REG({n}, {n}InferShape);\nVERIFY_FUNC_REG({n}, {n}Verify);\n}}  // namespace ge\n")


# --------------------------------------------------------------------------------------------------
# msopgen JSON
# --------------------------------------------------------------------------------------------------

def msopgen_json(decl: OpDecl) -> str:
    """msopgen's input JSON (a one-element list), for `msopgen gen -i <file> -lan cpp ...`."""
    def desc(t):
        types = [DTYPES[x][0] for x in t.types]
        return {"name": t.name, "param_type": t.param_type, "format": [_format(decl, t.name)] * len(types),
                "type": types}

    attrs = []
    for a in decl.attrs:
        entry = {"name": a.name, "param_type": "required" if a.required else "optional",
                 "type": MSOPGEN_ATTR_TYPES[a.type]}
        if not a.required:
            entry["default_value"] = a.default
        attrs.append(entry)
    op = {"op": decl.name, "language": "cpp", "input_desc": [desc(t) for t in decl.inputs],
          "output_desc": [desc(t) for t in decl.outputs], "attr": attrs}
    return json.dumps([op], indent=4) + "\n"


# --------------------------------------------------------------------------------------------------
# Ascend C project (msopgen -lan cpp layout)
# --------------------------------------------------------------------------------------------------

def op_host(decl: OpDecl, soc: str = "ascend310p") -> str:
    """`op_host/<op>.cpp`: the OpDef (inputs, outputs, attributes) plus marked infer-shape/tiling stubs."""
    n, s = decl.name, snake(decl.name)
    body = []
    for kind, items in (("Input", decl.inputs), ("Output", decl.outputs)):
        for t in items:
            dts = ", ".join(f"ge::{x}" for x in t.types)
            fmts = ", ".join([f"ge::FORMAT_{_format(decl, t.name)}"] * len(t.types))
            body.append(f"        this->{kind}(\"{t.name}\").ParamType({_PARAM[t.param_type]})"
                        f".DataType({{{dts}}}).Format({{{fmts}}});")
    for a in decl.attrs:
        if a.required:
            body.append(f"        this->Attr(\"{a.name}\").AttrType(REQUIRED).{a.type}();")
        else:
            body.append(f"        this->Attr(\"{a.name}\").AttrType(OPTIONAL).{a.type}({cpp_value(a.type, a.default)});")
    inputs = "\n".join(body)
    return f"""/* Generated by fusionlab: the Ascend C op definition of {n}.
 * {' '.join(_provenance(decl))}
 */
#include "{s}_tiling.h"
#include "register/op_def_registry.h"

namespace optiling {{
static ge::graphStatus TilingFunc(gert::TilingContext* context)
{{
    // {STUB_MARK}: split the output over the AI cores and fill {n}TilingData
    // (block count, tile sizes that fit the Unified Buffer, double-buffer depth).
    return ge::GRAPH_FAILED;
}}
}}  // namespace optiling

namespace ge {{
static ge::graphStatus InferShape(gert::InferShapeContext* context)
{{
    // {STUB_MARK}: port the shape rule of op_proto/{s}.cc (and fusionlab's OpDecl.infer) to gert.
    return GRAPH_FAILED;
}}
}}  // namespace ge

namespace ops {{
class {n} : public OpDef {{
public:
    explicit {n}(const char* name) : OpDef(name)
    {{
{inputs}
        this->SetInferShape(ge::InferShape);
        this->AICore().SetTiling(optiling::TilingFunc).AddConfig("{soc}");
    }}
}};
OP_ADD({n});
}}  // namespace ops
"""


def op_tiling(decl: OpDecl) -> str:
    """`op_host/<op>_tiling.h`: the tiling-data struct (fields to be chosen on the device)."""
    n = decl.name
    guard = f"{snake(n).upper()}_TILING_H"
    return f"""/* Generated by fusionlab. {STUB_MARK}: choose the tiling fields the kernel needs. */
#ifndef {guard}
#define {guard}
#include "register/tilingdata_base.h"

namespace optiling {{
BEGIN_TILING_DATA_DEF({n}TilingData)
TILING_DATA_FIELD_DEF(uint32_t, totalLength);
TILING_DATA_FIELD_DEF(uint32_t, tileNum);
END_TILING_DATA_DEF;
REGISTER_TILING_DATA_CLASS({n}, {n}TilingData)
}}  // namespace optiling
#endif  // {guard}
"""


#: ops that run on the Cube unit (matrix multiply-accumulate); everything else in a fused body runs on the Vector unit
CUBE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def has_fixpipe(soc: str) -> bool:
    """Whether the SoC has a FixPipe between L0C and memory (Atlas A2/A3: Ascend 910B/910_93); the 310P has not."""
    return soc.lower().startswith(("ascend910b", "ascend910_93"))


def kernel_pipeline(decl: OpDecl, soc: str = "Ascend310P3") -> list[str]:
    """The fused kernel's data path on one AI Core, as comment lines: the cube path for Conv/MatMul, else the vector path."""
    ops = [st.op for st in decl.body]
    epilogue = [op for op in ops if op not in CUBE_OPS]
    if not any(op in CUBE_OPS for op in ops):
        return ["Vector pipeline: CopyIn (MTE2: GM -> UB) -> Compute (Vector, in the UB) -> CopyOut (MTE3: UB -> GM),",
                "double-buffered with TQue<QuePosition::VECIN, 2> / TQue<QuePosition::VECOUT, 2>."]
    lines = ["Cube pipeline: GM -(MTE2)-> L1 (TQue<TPosition::A1, 2>, <TPosition::B1, 2>) -(MTE1)-> L0A / L0B",
             "(TQue<TPosition::A2, 2>, <TPosition::B2, 2>) -> Cube (Mmad, accumulating in L0C, TPosition::CO1).",
             "The depth-2 queues let MTE2/MTE1 load the next slice while the Cube works on this one."]
    rest = ", ".join(epilogue) or "nothing"
    if has_fixpipe(soc):
        lines += [f"Epilogue ({rest}) on {soc}: the bias can be added by Mmad itself (MmadParams.isBias, bias table),",
                  "and FixPipe moves L0C -> GM (or -> L1; Fixpipe, FixpipeParamsV220) applying a ReLU on the way",
                  "(reluEn) or quantising: a Conv + bias + ReLU never touches a vector core. The cube core (AIC) has",
                  "no UB: the UB belongs to the vector cores (AIV), so other epilogue ops go L0C -(FixPipe)-> GM,",
                  "then on an AIV GM -(MTE2)-> UB -> Vector -> MTE3 -> GM, the AIC and AIV synchronised on the GM data."]
    else:
        lines += [f"Epilogue ({rest}) on {soc}: no FixPipe; L0C -> UB (TPosition::CO2), the Vector unit applies it",
                  "in the UB, MTE3 writes the result to GM (TQue<QuePosition::VECOUT, 2>)."]
    return lines


def op_kernel(decl: OpDecl, soc: str = "Ascend310P3") -> str:
    """`op_kernel/<op>.cpp`: the kernel entry point with its body left to write on the device."""
    s = snake(decl.name)
    args = ", ".join(f"GM_ADDR {t.name}" for t in decl.inputs + decl.outputs)
    steps = "\n".join(f"    //   {st.output} = {st.op}({', '.join(st.inputs)})" for st in decl.body)
    path = "\n".join(f"    // {line}" for line in kernel_pipeline(decl, soc))
    return f"""/* Generated by fusionlab: kernel entry of {decl.name}. */
#include "kernel_operator.h"
using namespace AscendC;

extern "C" __global__ __aicore__ void {s}({args}, GM_ADDR workspace, GM_ADDR tiling)
{{
    GET_TILING_DATA(tiling_data, tiling);
    // {STUB_MARK}. The fused computation, with intermediates kept on chip (never written to GM):
{steps}
{path}
    // The reference numpy implementation is fusionlab.export.kernels.compute.
}}
"""


def onnx_plugin(decl: OpDecl, domain: str = "ai.onnx.contrib", version: int = 1) -> str:
    """`framework/onnx_plugin/<op>_plugin.cc`: maps the ONNX node to the op's attributes for ATC."""
    n = decl.name
    cases = []
    for a in decl.attrs:
        t = a.type
        if t == "ListInt":
            cases.append(f"""    if (attr.name() == "{a.name}") {{
      // fusionlab writes list attributes as comma-separated strings (the onnxruntime PyOp bridge reads no lists)
      std::vector<int64_t> v;
      if (attr.type() == ge::onnx::AttributeProto::INTS) {{
        v.assign(attr.ints().begin(), attr.ints().end());
      }} else if (attr.type() == ge::onnx::AttributeProto::STRING) {{
        std::stringstream ss(attr.s());
        std::string item;
        while (std::getline(ss, item, ',')) {{
          v.push_back(std::stoll(item));
        }}
      }}
      op_dest.SetAttr("{a.name}", v);
    }}""")
        elif t in ("Int", "Bool"):
            cast = "static_cast<bool>(attr.i())" if t == "Bool" else "attr.i()"
            cases.append(f"""    if (attr.name() == "{a.name}" && attr.type() == ge::onnx::AttributeProto::INT) {{
      op_dest.SetAttr("{a.name}", {cast});
    }}""")
        elif t == "Float":
            cases.append(f"""    if (attr.name() == "{a.name}" && attr.type() == ge::onnx::AttributeProto::FLOAT) {{
      op_dest.SetAttr("{a.name}", attr.f());
    }}""")
        elif t == "String":
            cases.append(f"""    if (attr.name() == "{a.name}" && attr.type() == ge::onnx::AttributeProto::STRING) {{
      op_dest.SetAttr("{a.name}", attr.s());
    }}""")
    body = "\n".join(cases) if cases else "    (void)attr;"
    return f"""/* Generated by fusionlab: lets ATC (--framework=5) parse the ONNX node {domain}:{n}. */
#include <sstream>
#include <string>
#include <vector>
#include "graph/operator.h"
#include "proto/onnx/ge_onnx.pb.h"
#include "register/register.h"

namespace domi {{
Status ParseParams{n}(const Message* op_src, ge::Operator& op_dest)
{{
  const ge::onnx::NodeProto* node = dynamic_cast<const ge::onnx::NodeProto*>(op_src);
  if (node == nullptr) {{
    return FAILED;
  }}
  for (const auto& attr : node->attribute()) {{
{body}
  }}
  return SUCCESS;
}}

REGISTER_CUSTOM_OP("{n}")
    .FrameworkType(ONNX)
    .OriginOpType("{domain}::{version}::{n}")
    .ParseParamsFn(ParseParams{n})
    .ImplyType(ImplyType::TVM);
}}  // namespace domi
"""


def cmake_presets(compute_unit: str = "ascend310p") -> str:
    """`CMakePresets.json` with the cache variables msopgen's template sets."""
    def var(t, v):
        return {"type": t, "value": v}

    preset = {
        "version": 1,
        "cmakeMinimumRequired": {"major": 3, "minor": 19, "patch": 0},
        "configurePresets": [{
            "name": "default", "displayName": "Default Config", "description": "Default build using Unix Makefiles",
            "generator": "Unix Makefiles", "binaryDir": "${sourceDir}/build_out",
            "cacheVariables": {
                "CMAKE_BUILD_TYPE": var("STRING", "Release"),
                "ENABLE_SOURCE_PACKAGE": var("BOOL", "True"),
                "ENABLE_BINARY_PACKAGE": var("BOOL", "True"),
                "ASCEND_COMPUTE_UNIT": var("STRING", compute_unit),
                "ENABLE_TEST": var("BOOL", "True"),
                "vendor_name": var("STRING", "customize"),
                "ASCEND_CANN_PACKAGE_PATH": var("PATH", "/usr/local/Ascend/ascend-toolkit/latest"),
                "ASCEND_PYTHON_EXECUTABLE": var("STRING", "python3"),
                "CMAKE_INSTALL_PREFIX": var("PATH", "${sourceDir}/build_out"),
                "ENABLE_CROSS_COMPILE": var("BOOL", "False"),
                "CMAKE_CROSS_PLATFORM_COMPILER": var("PATH", "/usr/bin/aarch64-linux-gnu-g++"),
            },
        }],
    }
    return json.dumps(preset, indent=4) + "\n"


def cmakelists(decl: OpDecl) -> str:
    """A placeholder top-level CMakeLists.txt that says where the real one comes from."""
    return f"""# Generated by fusionlab. This is NOT the full build: msopgen writes the real top-level
# CMakeLists.txt together with cmake/ (config.cmake, func.cmake, intf.cmake, makeself.cmake, util/).
# build.sh runs msopgen from ../msopgen/{snake(decl.name)}.json and then overlays op_host/, op_kernel/ and
# framework/ from this folder, so the official template supplies the build logic.
cmake_minimum_required(VERSION 3.16.0)
project(opp)
message(FATAL_ERROR "run ./build.sh: it generates the msopgen project this file stands in for")
"""


def build_sh(decl: OpDecl, soc: str = "Ascend310P3") -> str:
    """`build.sh`: msopgen the official project, overlay the generated sources, build the .run package."""
    s = snake(decl.name)
    return f"""#!/bin/bash
# Generated by fusionlab. Run on a machine with the CANN toolkit (msopgen on PATH).
# Usage: ./build.sh [soc_version]   (default {soc}; e.g. Ascend910B4)
set -e
SOC=${{1:-{soc}}}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT="$HERE/build_project"
rm -rf "$OUT"
msopgen gen -i "$HERE/../msopgen/{s}.json" -c "ai_core-$SOC" -lan cpp -out "$OUT"
cp "$HERE/op_host/{s}.cpp" "$HERE/op_host/{s}_tiling.h" "$OUT/op_host/"
cp "$HERE/op_kernel/{s}.cpp" "$OUT/op_kernel/"
mkdir -p "$OUT/framework/onnx_plugin"
cp "$HERE/framework/onnx_plugin/{s}_plugin.cc" "$OUT/framework/onnx_plugin/"
cd "$OUT"
bash build.sh   # msopgen's own script: cmake --preset=default, then the custom_opp_<os>_<arch>.run package
echo "install with: $OUT/build_out/custom_opp_*.run"
"""


def atc_command(model: str, decl_names: list[str], input_shape: str | None = None, soc: str = "Ascend310P3",
                output: str | None = None) -> str:
    """`atc.sh`: convert the ONNX model that uses the custom op(s), and the unfused baseline."""
    out = output or Path(model).stem
    shape = f' --input_shape="{input_shape}"' if input_shape else ""
    return f"""#!/bin/bash
# Generated by fusionlab. Install the custom-op package first (build the op project, run custom_opp_*.run),
# so ATC finds the {', '.join(decl_names)} prototype, kernel and ONNX plugin.
set -e
SOC=${{1:-{soc}}}
# the model whose fused groups are custom ops
atc --model={model} --framework=5 --output={out} --soc_version=$SOC{shape} --log=info
# the baseline: the original model, with CANN's own Conv+BN graph fusion and UB fusion switched off
# atc --model=<original>.onnx --framework=5 --output=baseline --soc_version=$SOC{shape} --fusion_switch_file=fusion_switch.cfg
"""


def fusion_switch_cfg() -> str:
    """`fusion_switch.cfg` (JSON form): switch off CANN's built-in Conv+BN folding and UB fusion for a baseline."""
    cfg = {"Switch": {"GraphFusion": {"ConvBatchnormFusionPass": "off"}, "UBFusion": {"ALL": "off"}}}
    return json.dumps(cfg, indent=4) + "\n"


def readme(decls: list[OpDecl], model: str | None) -> str:
    """`README.md` of the package: what is here, the seed's layout against the real one, next steps."""
    ops = "\n".join(f"- `{d.name}`: {' '.join(_provenance(d))}" for d in decls)
    return f"""# Custom-op package generated by fusionlab

{ops}

Model using the op(s): `{model or '(none written)'}` (domain `ai.onnx.contrib`, list attributes as
comma-separated strings, which is what the onnxruntime PyOp bridge can read; the ONNX plugin accepts
both strings and INTS).

## Layout

| here | what | real CANN counterpart |
|---|---|---|
| `op_proto/<op>.h`, `.cc` | `REG_OP` prototype, infer-shape and verify registrations | `op_proto/` of a TBE-style project (msopgen `-lan py`) |
| `msopgen/<op>.json` | msopgen input: `op`, `input_desc`, `output_desc`, `attr` | `msopgen gen -i <op>.json -c ai_core-<soc> -lan cpp -out <dir>` |
| `ascendc/` | Ascend C project: `op_host/`, `op_kernel/`, `framework/onnx_plugin/`, `CMakePresets.json`, `build.sh` | the project msopgen `-lan cpp` generates |
| `atc.sh`, `fusion_switch.cfg` | ONNX -> OM conversion, baseline without built-in fusion | `atc --framework=5 ... --fusion_switch_file=...` |

The seed's package is `custom_ops/{{op_kernel/, op_proto/, CMakeLists.txt, version.json}}`. The real ones differ:
an Ascend C project has `op_host/` (prototype, tiling, infer-shape) beside `op_kernel/`; a TBE project has
`op_proto/` and `tbe/`. There is no `version.json`: the built package carries
`vendors/<vendor>/version.info`, one line `custom_opp_compiler_version=<x.y.z>`, written at build time by
`cmake/util/gen_version_info.sh` from the installed compiler. fusionlab therefore does not write one.

## What is left to do on an Ascend machine ({STUB_MARK})

- `ascendc/op_kernel/*.cpp`: the kernel body; `ascendc/op_host/*`: the tiling function and the gert infer-shape.
- Build: `cd ascendc && ./build.sh <soc_version>`; install the `custom_opp_*.run`; then `./atc.sh <soc_version>`.
- Nothing here was compiled: there is no CANN toolkit on the machine that generated it.
"""


# --------------------------------------------------------------------------------------------------
# the package
# --------------------------------------------------------------------------------------------------

def package_files(decls: list[OpDecl], model_name: str | None = None, input_shape: str | None = None,
                  soc: str = "Ascend310P3") -> dict[str, str]:
    """{relative path: text} of the whole package, sorted by path."""
    compute_unit = soc.lower()[:-1] if soc[-1:].isdigit() and soc.lower().startswith("ascend310p") else soc.lower()
    files: dict[str, str] = {}
    for d in sorted(decls, key=lambda d: d.name):
        s = snake(d.name)
        files[f"op_proto/{s}.h"] = proto_header(d)
        files[f"op_proto/{s}.cc"] = proto_source(d)
        files[f"msopgen/{s}.json"] = msopgen_json(d)
        files[f"ascendc/op_host/{s}.cpp"] = op_host(d, compute_unit)
        files[f"ascendc/op_host/{s}_tiling.h"] = op_tiling(d)
        files[f"ascendc/op_kernel/{s}.cpp"] = op_kernel(d, soc)
        files[f"ascendc/framework/onnx_plugin/{s}_plugin.cc"] = onnx_plugin(d)
        files[f"ascendc/build_{s}.sh" if len(decls) > 1 else "ascendc/build.sh"] = build_sh(d, soc)
    first = sorted(decls, key=lambda d: d.name)[0]
    files["ascendc/CMakeLists.txt"] = cmakelists(first)
    files["ascendc/CMakePresets.json"] = cmake_presets(compute_unit)
    if model_name:
        files["atc.sh"] = atc_command(model_name, [d.name for d in decls], input_shape, soc)
    files["fusion_switch.cfg"] = fusion_switch_cfg()
    files["README.md"] = readme(sorted(decls, key=lambda d: d.name), model_name)
    return dict(sorted(files.items()))


def write_package(out_dir, files: dict[str, str], *, force: bool = False) -> list[Path]:
    """Write the files under `out_dir` (each atomically); refuse a non-empty folder unless `force`."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} is not empty; pass --force to write into it")
    written = []
    for rel, text in files.items():
        p = out / rel
        atomic_write(p, text.encode(), mode=default_mode(p, executable=p.suffix == ".sh"))
        written.append(p)
    return written


# --------------------------------------------------------------------------------------------------
# fusion_result.json and the fusion switch file: the plan as ATC reports it
# --------------------------------------------------------------------------------------------------


GRAPH, UB = "graph_fusion", "ub_fusion"

#: fusionlab rule -> [(stage, ATC pass)]; pass names are the registered ones listed in cann_facts.md s6
#: (ConvBatchnormFusionPass, ConvScaleFusionPass and MatMulBiasAddFusionPass are graph fusion passes;
#: TbeCommonRules0FusionPass is the UB fusion pass that merges a Conv with its elementwise consumers).
ATC_PASSES: dict[str, list[tuple[str, str]]] = {
    "conv_bn": [(GRAPH, "ConvBatchnormFusionPass")],
    "convtranspose_bn": [(GRAPH, "ConvBatchnormFusionPass")],
    "conv_scale_bias": [(GRAPH, "ConvScaleFusionPass")],
    "conv_act": [(UB, "TbeCommonRules0FusionPass")],
    "conv_bn_act": [(GRAPH, "ConvBatchnormFusionPass"), (UB, "TbeCommonRules0FusionPass")],
    "conv_add_act": [(UB, "TbeCommonRules0FusionPass")],
    "matmul_add_gemm": [(GRAPH, "MatMulBiasAddFusionPass")],
}


def _camel(rule: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^0-9a-zA-Z]+", rule) if part)


def pass_for(group) -> list[tuple[str, str]]:
    """[(stage, pass name)] a group is counted under: the ATC pass for its rule, or a Fusionlab<Rule> pass."""
    if group.rule in ATC_PASSES:
        passes = list(ATC_PASSES[group.rule])
        folds_bn = "BatchNormalization" in group.op_types and group.rule.startswith("conv")
        if folds_bn and (GRAPH, "ConvBatchnormFusionPass") not in passes:  # e.g. conv_add_act over Conv+BN+Add+Relu
            passes.insert(0, (GRAPH, "ConvBatchnormFusionPass"))
        return passes
    # graph-level rewrites (folds, horizontal concatenation, op substitution) vs kernel-level merging
    stage = UB if group.kind == "mixed" or group.rule.endswith("_act") else GRAPH
    return [(stage, f"Fusionlab{_camel(group.rule)}FusionPass")]


def fusion_result(plan, session_and_graph_id: str = "0_0") -> dict:
    """A FusionPlan as ATC's fusion_result.json (a dict; `fusion_result_json` gives the text)."""
    counts: dict[tuple[str, str], int] = {}
    for group in plan:
        for stage, name in pass_for(group):
            counts[(stage, name)] = counts.get((stage, name), 0) + 1
    result: dict = {GRAPH: {}, "session_and_graph_id": session_and_graph_id, UB: {}}
    for (stage, name), n in sorted(counts.items()):
        result[stage][name] = {"effect_times": str(n), "match_times": str(n)}
    return result


def fusion_result_json(plan, session_and_graph_id: str = "0_0") -> str:
    """The text of fusion_result.json for a plan (keys sorted, as in ATC's output)."""
    return json.dumps(fusion_result(plan, session_and_graph_id), indent=4, sort_keys=True)


def read_fusion_result(text: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Parse a fusion_result.json (ATC's or ours): {stage: {pass: (match_times, effect_times)}}."""
    data = json.loads(text)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for stage in (GRAPH, UB):
        out[stage] = {name: (int(v["match_times"]), int(v["effect_times"])) for name, v in data.get(stage, {}).items()}
    return out


def fusion_switch(off: Iterable[str] = (), *, all_off: bool = False) -> str:
    """A ``--fusion_switch_file`` (JSON form) turning the named passes off; all_off=True: every switchable one."""
    graph: dict[str, str] = {}
    ub: dict[str, str] = {}
    if all_off:
        graph["ALL"] = ub["ALL"] = "off"
    for name in off:
        stages = {stage for passes in ATC_PASSES.values() for stage, n in passes if n == name}
        for stage in stages or {GRAPH}:
            (graph if stage == GRAPH else ub)[name] = "off"
    return json.dumps({"Switch": {"GraphFusion": graph, "UBFusion": ub}}, indent=4)
