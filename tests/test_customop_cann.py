"""The generated CANN files: parsed back against the declaration, msopgen fields, determinism, safe writing."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from fusionlab import zoo
from fusionlab.export import package_files, reg_op, replace_groups, write_package
from fusionlab.export.cann import MSOPGEN_ATTR_TYPES, STUB_MARK, msopgen_json, proto_header, proto_source, snake
from fusionlab.export.declare import DTYPES
from fusionlab.graph import load
from fusionlab.plan import FusionGroup

ROOT = Path(__file__).resolve().parent.parent


def decls():
    g = load(zoo.conv_bn_relu(3, 8, 3, image_size=8))
    grp = FusionGroup("g0", "vertical", "t", [n.name for n in g], [n.op_type for n in g])
    conv = replace_groups(g, grp, register_kernels=False).ops[0].decl
    leaky = (reg_op("MatMulAddLeakyRelu").INPUT("x", ["DT_FLOAT16", "DT_FLOAT"]).INPUT("x1", ["float32"])
             .INPUT("const0", ["float32"]).OUTPUT("y", ["float32"]).ATTR("negative_slope", "Float", 0.01)
             .fuses("MatMul", "Add", "LeakyRelu").OP_END_FACTORY_REG("MatMulAddLeakyRelu"))
    return [conv, leaky]


_CHAIN = re.compile(r"REG_OP\((\w+)\)\n(.*?)\n\s*\.OP_END_FACTORY_REG\((\w+)\)", re.S)
_TENSOR = re.compile(r"\.(INPUT|OPTIONAL_INPUT|DYNAMIC_INPUT|OUTPUT|DYNAMIC_OUTPUT)\((\w+), TensorType\(\{([^}]*)\}\)\)")
_ATTR = re.compile(r"\.ATTR\((\w+), (\w+), (.+)\)$")
_REQ = re.compile(r"\.REQUIRED_ATTR\((\w+), (\w+)\)$")


def parse_header(text):
    """A small parser for the REG_OP chain: {name, inputs, outputs, attrs}."""
    m = _CHAIN.search(text)
    assert m, "no REG_OP chain"
    name, body, end = m.groups()
    assert name == end
    out = {"name": name, "inputs": [], "outputs": [], "attrs": []}
    kinds = {"INPUT": "required", "OPTIONAL_INPUT": "optional", "DYNAMIC_INPUT": "dynamic", "OUTPUT": "required",
             "DYNAMIC_OUTPUT": "dynamic"}
    for line in body.splitlines():
        line = line.strip()
        if t := _TENSOR.fullmatch(line):
            macro, tname, types = t.groups()
            key = "outputs" if "OUTPUT" in macro else "inputs"
            out[key].append((tname, kinds[macro], tuple(x.strip() for x in types.split(","))))
        elif a := _REQ.fullmatch(line):
            out["attrs"].append((a.group(1), a.group(2), None, True))
        elif a := _ATTR.fullmatch(line):
            raw = a.group(3)
            value = json.loads(raw.replace("{", "[").replace("}", "]").replace("true", "true"))
            out["attrs"].append((a.group(1), a.group(2), value, False))
        else:
            raise AssertionError(f"unparsed line {line!r}")
    return out


@pytest.mark.parametrize("i", [0, 1])
def test_prototype_parses_back_to_the_declaration(i):
    d = decls()[i]
    text = proto_header(d)
    parsed = parse_header(text)
    assert parsed["name"] == d.name
    assert parsed["inputs"] == [(t.name, t.param_type, t.types) for t in d.inputs]
    assert parsed["outputs"] == [(t.name, t.param_type, t.types) for t in d.outputs]
    assert parsed["attrs"] == [(a.name, a.type, a.default, a.required) for a in d.attrs]
    assert '#include "graph/operator_reg.h"' in text and "namespace ge {" in text
    guard = f"GE_OP_{snake(d.name).upper()}_H"
    assert f"#ifndef {guard}" in text and f"#define {guard}" in text


def test_prototype_source_registers_infer_and_verify():
    d = decls()[0]
    cc = proto_source(d)
    assert f'#include "{snake(d.name)}.h"' in cc
    for line in ["IMPLEMT_INFERFUNC(ConvRelu, ConvReluInferShape)", "IMPLEMT_VERIFIER(ConvRelu, ConvReluVerify)",
                 "INFER_FUNC_REG(ConvRelu, ConvReluInferShape);", "VERIFY_FUNC_REG(ConvRelu, ConvReluVerify);"]:
        assert line in cc
    assert cc.count("{") == cc.count("}")


MSOPGEN_TYPES = {v[0] for v in DTYPES.values()}


@pytest.mark.parametrize("i", [0, 1])
def test_msopgen_json_has_the_msopgen_fields(i):
    d = decls()[i]
    doc = json.loads(msopgen_json(d))
    assert isinstance(doc, list) and len(doc) == 1
    op = doc[0]
    assert set(op) == {"op", "language", "input_desc", "output_desc", "attr"}
    assert op["op"] == d.name and op["language"] == "cpp"
    for key, items in (("input_desc", d.inputs), ("output_desc", d.outputs)):
        assert [e["name"] for e in op[key]] == [t.name for t in items]
        for e, t in zip(op[key], items):
            assert set(e) == {"name", "param_type", "format", "type"}
            assert e["param_type"] in ("required", "optional", "dynamic") and e["param_type"] == t.param_type
            assert len(e["format"]) == len(e["type"]) == len(t.types)  # msopgen: positional lists, same length
            assert set(e["type"]) <= MSOPGEN_TYPES and set(e["format"]) <= {"ND", "NCHW"}
    for e, a in zip(op["attr"], d.attrs):
        assert e["name"] == a.name and e["type"] == MSOPGEN_ATTR_TYPES[a.type]
        assert e["param_type"] == ("required" if a.required else "optional")
        assert ("default_value" in e) == (not a.required)
        if not a.required:
            assert e["default_value"] == a.default


def test_package_tree_and_stub_marks():
    files = package_files([decls()[0]], "m_customop.onnx", "input:1,3,8,8")
    assert sorted(files) == [
        "README.md", "ascendc/CMakeLists.txt", "ascendc/CMakePresets.json", "ascendc/build.sh",
        "ascendc/framework/onnx_plugin/conv_relu_plugin.cc", "ascendc/op_host/conv_relu.cpp",
        "ascendc/op_host/conv_relu_tiling.h", "ascendc/op_kernel/conv_relu.cpp", "atc.sh", "fusion_switch.cfg",
        "msopgen/conv_relu.json", "op_proto/conv_relu.cc", "op_proto/conv_relu.h"]
    assert STUB_MARK in files["ascendc/op_kernel/conv_relu.cpp"] and STUB_MARK in files["ascendc/op_host/conv_relu.cpp"]
    assert 'this->Attr("strides").AttrType(REQUIRED).ListInt();' in files["ascendc/op_host/conv_relu.cpp"]
    assert 'OriginOpType("ai.onnx.contrib::1::ConvRelu")' in files["ascendc/framework/onnx_plugin/conv_relu_plugin.cc"]
    assert "atc --model=m_customop.onnx --framework=5" in files["atc.sh"]
    assert "msopgen gen -i" in files["ascendc/build.sh"] and "-lan cpp" in files["ascendc/build.sh"]
    cfg = json.loads(files["fusion_switch.cfg"])
    assert set(cfg["Switch"]) == {"GraphFusion", "UBFusion"}
    assert all(v in ("on", "off") for part in cfg["Switch"].values() for v in part.values())
    presets = json.loads(files["ascendc/CMakePresets.json"])
    assert presets["configurePresets"][0]["cacheVariables"]["ASCEND_COMPUTE_UNIT"]["value"] == "ascend310p"
    assert "version.info" in files["README.md"] and "version.json" in files["README.md"]


def test_write_package_refuses_non_empty_and_writes_atomically(tmp_path):
    files = package_files([decls()[0]])
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        write_package(tmp_path, files)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    write_package(tmp_path, files, force=True)
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert not list(tmp_path.rglob("*.tmp"))
    assert (tmp_path / "ascendc/build.sh").stat().st_mode & 0o111


def _tree_digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_cli_output_is_byte_identical_across_runs(tmp_path):
    model = tmp_path / "cbr.onnx"
    onnx.save(zoo.conv_bn_relu(3, 8, 3, image_size=8), model)
    digests = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        proc = subprocess.run([sys.executable, "-m", "fusionlab", "customop", str(model), "--group", "v0",
                               "--out", str(out), "--no-verify"], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        digests.append(_tree_digest(out))
    assert digests[0] == digests[1]
    assert "cbr_customop.onnx" in digests[0] and len(digests[0]) == 14


def test_kernel_stub_describes_the_cube_path_for_a_conv_and_the_vector_path_otherwise():
    from fusionlab.export.cann import has_fixpipe, kernel_pipeline, op_kernel

    conv = decls()[0]  # ConvRelu: Conv on the Cube, ReLU in the epilogue
    on_310p = op_kernel(conv, "Ascend310P3")
    assert "Cube pipeline" in on_310p and "L0A / L0B" in on_310p and "L0C" in on_310p
    assert "MTE2: GM -> UB) -> Compute (Vector" not in on_310p  # not the vector kernel's CopyIn/Compute/CopyOut
    assert "no FixPipe" in on_310p and "Vector unit applies it" in on_310p
    on_a2 = op_kernel(conv, "Ascend910B4")
    assert "FixPipe moves L0C -> GM" in on_a2 and "reluEn" in on_a2
    assert has_fixpipe("Ascend910B4") and not has_fixpipe("Ascend310P3")
    # the package passes its SoC on to the kernel stub
    assert "FixPipe moves L0C -> GM" in package_files([conv], soc="Ascend910B4")["ascendc/op_kernel/conv_relu.cpp"]
    vector = (reg_op("SigmoidMul").INPUT("x", ["DT_FLOAT16"]).OUTPUT("y", ["DT_FLOAT16"])
              .fuses("Sigmoid", "Mul").OP_END_FACTORY_REG("SigmoidMul"))
    lines = kernel_pipeline(vector)
    assert lines[0].startswith("Vector pipeline: CopyIn (MTE2: GM -> UB) -> Compute (Vector")
    assert not any("Cube" in line for line in lines)
