"""Declaring a custom fused operator the way CANN's `REG_OP` does, and checking the declaration.

    decl = (reg_op("ConvRelu")
            .INPUT("x", ["DT_FLOAT16", "DT_FLOAT"])
            .INPUT("filter", ["DT_FLOAT16", "DT_FLOAT"])
            .OPTIONAL_INPUT("bias", ["DT_FLOAT16", "DT_FLOAT"])
            .OUTPUT("y", ["DT_FLOAT16", "DT_FLOAT"])
            .REQUIRED_ATTR("strides", "ListInt")
            .REQUIRED_ATTR("pads", "ListInt")
            .ATTR("dilations", "ListInt", [1, 1, 1, 1])
            .ATTR("groups", "Int", 1)
            .ATTR("data_format", "String", "NCHW")
            .fuses("Conv", "Relu")
            .OP_END_FACTORY_REG("ConvRelu"))

The chain mirrors `graph/operator_reg.h` (metadef): INPUT / OPTIONAL_INPUT / DYNAMIC_INPUT / OUTPUT /
DYNAMIC_OUTPUT / ATTR / REQUIRED_ATTR, closed by OP_END_FACTORY_REG whose name must equal the REG_OP
name (the C++ macro enforces that with a static_assert). `OP_END_FACTORY_REG` validates the seed's three
rules and raises `DeclarationError` listing every problem:

1. every input and output declares its tensor types;
2. attribute names match the CANN built-in op they come from (`stride` -> "did you mean `strides`?");
3. the op name says what it fuses (`ConvRelu`, not `MyOp`).

`OpDecl.infer` does shape and type inference from the declaration alone (Conv2D output-size formula from
the CANN Conv2D documentation, broadcasting for element-wise ops, matmul rules).
"""

from __future__ import annotations

import difflib
import json
import keyword
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = [
    "DeclarationError", "TensorDesc", "AttrDesc", "Step", "OpDecl", "OpBuilder", "reg_op", "BUILTINS", "Builtin",
    "DTYPES", "ATTR_TYPES", "canonical_dtype", "validate", "problems", "name_for", "matmul_operands",
]


class DeclarationError(ValueError):
    """A custom-op declaration that breaks a rule; `.problems` lists each one."""

    def __init__(self, op: str, problems: Sequence[str]):
        self.op = op
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(f"{op}: {n} problem{'s' if n != 1 else ''}: " + "; ".join(self.problems))


# --------------------------------------------------------------------------------------------------
# vocabulary: CANN data types, attribute types and the built-in ops fused groups inherit from
# --------------------------------------------------------------------------------------------------

#: CANN DataType enum name -> (msopgen JSON type string, numpy dtype or None)
DTYPES: dict[str, tuple[str, Any]] = {
    "DT_FLOAT16": ("float16", np.float16),
    "DT_FLOAT": ("float", np.float32),
    "DT_BF16": ("bfloat16", None),
    "DT_DOUBLE": ("double", np.float64),
    "DT_INT8": ("int8", np.int8),
    "DT_INT16": ("int16", np.int16),
    "DT_INT32": ("int32", np.int32),
    "DT_INT64": ("int64", np.int64),
    "DT_UINT8": ("uint8", np.uint8),
    "DT_BOOL": ("bool", np.bool_),
}
_DTYPE_ALIASES = {
    "float": "DT_FLOAT", "float32": "DT_FLOAT", "fp32": "DT_FLOAT", "DT_FLOAT32": "DT_FLOAT",
    "float16": "DT_FLOAT16", "fp16": "DT_FLOAT16", "half": "DT_FLOAT16",
    "bfloat16": "DT_BF16", "bf16": "DT_BF16", "double": "DT_DOUBLE", "float64": "DT_DOUBLE",
    "int8": "DT_INT8", "int16": "DT_INT16", "int32": "DT_INT32", "int64": "DT_INT64", "uint8": "DT_UINT8",
    "bool": "DT_BOOL",
}
_NUMPY_TO_DT = {np.dtype(v[1]): k for k, v in DTYPES.items() if v[1] is not None}

#: CANN attribute type tokens fusionlab can declare, generate and run (a subset of operator_reg.h's list)
ATTR_TYPES = ("Int", "Float", "Bool", "String", "ListInt", "ListFloat", "ListBool", "ListString")
_OTHER_CANN_ATTR_TYPES = ("Tensor", "Type", "NamedAttrs", "ListTensor", "Bytes", "ListListInt", "ListType",
                          "ListNamedAttrs", "AscendString", "ListAscendString")

#: names that say nothing about what an op computes
_GENERIC_NAMES = {"myop", "customop", "fusedop", "fusionop", "newop", "op", "test", "testop", "kernel", "mykernel",
                  "custom", "fused", "fusion"}


def canonical_dtype(t) -> str:
    """`DT_FLOAT`, `float32`, `fp16`, a numpy dtype ... -> the CANN enum name (ValueError if unknown)."""
    if not isinstance(t, str):
        try:
            return _NUMPY_TO_DT[np.dtype(t)]
        except (TypeError, KeyError):
            raise ValueError(f"unknown tensor type {t!r}") from None
    if t in DTYPES:
        return t
    if t in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[t]
    if t.lower() in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[t.lower()]
    raise ValueError(f"unknown tensor type {t!r} (use CANN names such as DT_FLOAT16, DT_FLOAT)")


#: the REG_OP macro of an input or output by its param type
_MACRO_IN = {"required": "INPUT", "optional": "OPTIONAL_INPUT", "dynamic": "DYNAMIC_INPUT"}
_MACRO_OUT = {"required": "OUTPUT", "optional": "OUTPUT", "dynamic": "DYNAMIC_OUTPUT"}


def cpp_value(type_: str, v) -> str:
    """A default value as C++ source for its CANN attr type (Bool, Float, Int, String, List*)."""
    if type_ == "Bool":
        return "true" if v else "false"
    if type_ == "Float":
        return repr(float(v))
    if type_ == "Int":
        return str(int(v))
    if type_ == "String":
        return json.dumps(str(v))
    inner = type_[4:]
    return "{" + ", ".join(cpp_value(inner, x) for x in v) + "}"


@dataclass(frozen=True)
class Builtin:
    """A CANN built-in op that an ONNX op maps to, with its attribute names and types."""

    onnx: str
    cann: str
    token: str  # how the op shows in a fused op's name
    attrs: dict = field(default_factory=dict)  # CANN attr name -> CANN attr type
    aliases: tuple = ()  # other accepted name tokens


#: ONNX op -> CANN built-in. Attribute names are the CANN ones (Conv2D and BatchNorm from the
#: nn_calculation_ops.h / nn_norm_ops.h prototypes; LeakyRelu from the LeakyReluDemo sample).
BUILTINS: dict[str, Builtin] = {b.onnx: b for b in [
    Builtin("Conv", "Conv2D", "Conv", {"strides": "ListInt", "pads": "ListInt", "dilations": "ListInt",
                                       "groups": "Int", "data_format": "String", "offset_x": "Int"}),
    Builtin("BatchNormalization", "BatchNorm", "Bn", {"epsilon": "Float", "data_format": "String",
                                                      "is_training": "Bool"}, aliases=("BatchNorm",)),
    Builtin("Relu", "Relu", "Relu"),
    Builtin("LeakyRelu", "LeakyRelu", "LeakyRelu", {"negative_slope": "Float"}),
    Builtin("Sigmoid", "Sigmoid", "Sigmoid"),
    Builtin("Tanh", "Tanh", "Tanh"),
    Builtin("Add", "Add", "Add"),
    Builtin("Sub", "Sub", "Sub"),
    Builtin("Mul", "Mul", "Mul"),
    Builtin("Div", "Div", "Div"),
    Builtin("Erf", "Erf", "Erf"),
    Builtin("MatMul", "MatMul", "MatMul", {"transpose_x1": "Bool", "transpose_x2": "Bool"}),
]}

#: compound names that cover several member ops (Sigmoid+Mul is SiLU/Swish, the Erf chain is GELU)
_COMPOUND_TOKENS = {
    "Silu": {"Sigmoid", "Mul"}, "Swish": {"Sigmoid", "Mul"},
    "Gelu": {"Div", "Erf", "Add", "Mul"},
}

#: common misspellings / framework-specific names of CANN attributes
_ATTR_ALIASES = {"stride": "strides", "padding": "pads", "pad": "pads", "paddings": "pads", "dilation": "dilations",
                 "group": "groups", "eps": "epsilon", "alpha": "negative_slope", "format": "data_format"}


# --------------------------------------------------------------------------------------------------
# the declaration
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorDesc:
    """One input or output: name, allowed CANN types, and required/optional/dynamic."""

    name: str
    types: tuple
    param_type: str = "required"


@dataclass(frozen=True)
class AttrDesc:
    """One attribute: name, CANN type token, default (None when required)."""

    name: str
    type: str
    default: Any = None
    required: bool = False


@dataclass(frozen=True)
class Step:
    """One member op of the fused kernel: ONNX op type, value names in/out, attrs it reads."""

    op: str
    inputs: tuple
    output: str
    attrs: tuple = ()


@dataclass
class OpDecl:
    """A validated custom-op declaration; `body` is the computation the kernel performs."""

    name: str
    inputs: list[TensorDesc]
    outputs: list[TensorDesc]
    attrs: list[AttrDesc]
    fused: tuple = ()  # ONNX op types the kernel computes, in order
    folded: tuple = ()  # ONNX op types folded away at declaration time (e.g. BatchNormalization)
    body: list[Step] = field(default_factory=list)

    # -- views -------------------------------------------------------------------------------------
    def attr(self, name: str) -> AttrDesc:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(name)

    def attr_values(self, given: dict | None = None) -> dict:
        """Defaults filled in with `given`; KeyError-style ValueError for a missing required attr."""
        given = dict(given or {})
        unknown = sorted(set(given) - {a.name for a in self.attrs})
        if unknown:
            raise ValueError(f"{self.name}: unknown attribute(s) {unknown}")
        out = {}
        for a in self.attrs:
            if a.name in given:
                out[a.name] = given[a.name]
            elif a.required:
                raise ValueError(f"{self.name}: required attribute {a.name!r} not given")
            else:
                out[a.name] = a.default
        return out

    def signature(self) -> tuple:
        """Everything that fixes the kernel's interface and computation (for registry clashes)."""
        return (self.name, tuple(self.inputs), tuple(self.outputs), tuple(self.attrs), tuple(self.body))

    def reg_op(self) -> str:
        """The C++ `REG_OP(Name) ... .OP_END_FACTORY_REG(Name)` chain (4-space indented, as in CANN headers)."""
        lines = [f"REG_OP({self.name})"]
        for t in self.inputs:
            lines.append(f"    .{_MACRO_IN[t.param_type]}({t.name}, TensorType({{{', '.join(t.types)}}}))")
        for t in self.outputs:
            lines.append(f"    .{_MACRO_OUT[t.param_type]}({t.name}, TensorType({{{', '.join(t.types)}}}))")
        for a in self.attrs:
            if a.required:
                lines.append(f"    .REQUIRED_ATTR({a.name}, {a.type})")
            else:
                lines.append(f"    .ATTR({a.name}, {a.type}, {cpp_value(a.type, a.default)})")
        lines.append(f"    .OP_END_FACTORY_REG({self.name})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.reg_op()

    # -- inference ---------------------------------------------------------------------------------
    def infer(self, shapes: dict[str, Sequence[int]], dtypes: dict[str, Any] | None = None,
              attrs: dict | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
        """Output {name: (shape, CANN dtype)} from input shapes (and dtypes), evaluating the body."""
        values = self.attr_values(attrs)
        dtypes = {k: canonical_dtype(v) for k, v in (dtypes or {}).items()}
        env: dict[str, tuple[tuple[int, ...], str | None]] = {}
        for t in self.inputs:
            if t.name in shapes:
                env[t.name] = (tuple(int(d) for d in shapes[t.name]), dtypes.get(t.name))
            elif t.param_type == "required":
                raise ValueError(f"{self.name}: shape of required input {t.name!r} not given")
        for t in self.inputs:
            dt = env.get(t.name, (None, None))[1]
            if dt is not None and dt not in t.types:
                raise ValueError(f"{self.name}: input {t.name!r} has type {dt}, declared {list(t.types)}")
        if not self.body:
            raise ValueError(f"{self.name}: no body to infer from (declare it with .fuses(...))")
        for step in self.body:
            args = [env.get(n) for n in step.inputs]
            env[step.output] = (_infer_step(self.name, step, args, values), next(
                (a[1] for a in args if a is not None and a[1] is not None), None))
        out = {}
        for t in self.outputs:
            shape, dt = env[t.name]
            out[t.name] = (shape, dt or t.types[0])
        return out


def matmul_operands(a: np.ndarray, b: np.ndarray, values: dict) -> tuple[np.ndarray, np.ndarray]:
    """CANN MatMul's operands as it multiplies them: `transpose_x1` / `transpose_x2` swap the last two axes first."""
    if values.get("transpose_x1") and a.ndim >= 2:
        a = np.swapaxes(a, -1, -2)
    if values.get("transpose_x2") and b.ndim >= 2:
        b = np.swapaxes(b, -1, -2)
    return a, b


def _conv_out(size: int, k: int, pad_a: int, pad_b: int, stride: int, dil: int) -> int:
    # CANN Conv2D doc: out = (in + pad_a + pad_b - (dilation * (k - 1) + 1)) / stride + 1
    return (size + pad_a + pad_b - (dil * (k - 1) + 1)) // stride + 1


def _infer_step(op_name: str, step: Step, args, values) -> tuple[int, ...]:
    shapes = [a[0] if a is not None else None for a in args]
    if step.op == "Conv":
        x, w = shapes[0], shapes[1]
        if x is None or w is None or len(x) != 4 or len(w) != 4:
            raise ValueError(f"{op_name}: Conv2D needs 4-D x and filter, got {x} and {w}")
        if values.get("data_format", "NCHW") != "NCHW":
            raise ValueError(f"{op_name}: only data_format NCHW is supported")
        s, p, d, g = values["strides"], values["pads"], values.get("dilations") or [1, 1, 1, 1], values.get("groups", 1)
        if x[1] != w[1] * g:
            raise ValueError(f"{op_name}: x has {x[1]} channels, filter expects {w[1]} x groups {g}")
        if len(shapes) > 2 and shapes[2] is not None and tuple(shapes[2]) != (w[0],):
            raise ValueError(f"{op_name}: bias shape {shapes[2]} != ({w[0]},)")
        oh = _conv_out(x[2], w[2], p[0], p[1], s[2], d[2])
        ow = _conv_out(x[3], w[3], p[2], p[3], s[3], d[3])
        if oh <= 0 or ow <= 0:
            raise ValueError(f"{op_name}: output would be empty ({oh}x{ow})")
        return (x[0], w[0], oh, ow)
    if step.op == "MatMul":
        a, b = shapes
        if not (a and b):
            return ()
        a, b = matmul_operands(np.empty(a, np.int8), np.empty(b, np.int8), values)
        try:
            return tuple(np.matmul(a, b).shape)
        except ValueError:
            raise ValueError(f"{op_name}: MatMul of {a.shape} and {b.shape} (after transpose_x1/x2) does not "
                             f"multiply") from None
    present = [s for s in shapes if s is not None]
    try:
        return tuple(np.broadcast_shapes(*present))
    except ValueError:
        raise ValueError(f"{op_name}: {step.op} inputs {present} do not broadcast") from None


# --------------------------------------------------------------------------------------------------
# validation: the seed's three rules, plus what the C++ macros would reject
# --------------------------------------------------------------------------------------------------

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def name_for(op_types: Iterable[str]) -> str:
    """The name a fused op gets from its member ONNX op types: ('Conv', 'Relu') -> 'ConvRelu'."""
    tokens = []
    for t in op_types:
        tok = BUILTINS[t].token if t in BUILTINS else t
        if not tokens or tokens[-1] != tok:
            tokens.append(tok)
    return "".join(tokens)


def _suggest_attr(name: str, allowed: Iterable[str]) -> str | None:
    allowed = sorted(allowed)
    if name in _ATTR_ALIASES and _ATTR_ALIASES[name] in allowed:
        return _ATTR_ALIASES[name]
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.5)
    return close[0] if close else None


def _name_covers(name: str, op_types: Sequence[str]) -> list[str]:
    """Member ops the name does not mention (empty list: the name reflects the fusion)."""
    low = name.lower()
    covered: set[str] = set()
    for compound, ops in _COMPOUND_TOKENS.items():
        if compound.lower() in low:
            covered |= ops
    missing = []
    for t in op_types:
        if t in covered:
            continue
        b = BUILTINS.get(t)
        tokens = [t] + ([b.token, b.cann, *b.aliases] if b else [])
        if not any(tok.lower() in low for tok in tokens):
            missing.append(t)
    return missing


def _macro_problems(decl: OpDecl, end_name: str | None) -> list[str]:
    """What the C++ macros reject: identifiers, a mismatched OP_END_FACTORY_REG, duplicates, no output."""
    out: list[str] = []
    name = decl.name
    if not _IDENT.match(name) or keyword.iskeyword(name):
        out.append(f"op name {name!r} is not a C++ identifier")
    if end_name is not None and end_name != name:
        out.append(f"OP_END_FACTORY_REG({end_name}) does not match REG_OP({name}): the class name entered into "
                   f"the OP_END_FACTORY_REG needs to be the same as the operator name")
    seen: set[str] = set()
    for kind, items in (("input", decl.inputs), ("output", decl.outputs), ("attribute", decl.attrs)):
        for it in items:
            if not _IDENT.match(it.name):
                out.append(f"{kind} name {it.name!r} is not a C++ identifier")
            if it.name in seen:
                out.append(f"{kind} {it.name!r} declared twice")
            seen.add(it.name)
    if not decl.outputs:
        out.append("the op declares no OUTPUT")
    return out


def _tensor_type_problems(decl: OpDecl) -> list[str]:
    """Rule 1: every input and output declares known tensor types."""
    out: list[str] = []
    for kind, items in (("INPUT", decl.inputs), ("OUTPUT", decl.outputs)):
        for t in items:
            if not t.types:
                out.append(f"rule 1: {kind}({t.name}) declares no tensor types; write e.g. "
                           f"TensorType({{DT_FLOAT16, DT_FLOAT}})")
            for ty in t.types:
                if ty not in DTYPES:
                    out.append(f"rule 1: {kind}({t.name}) has unknown type {ty!r}")
    return out


def _attr_type_problems(decl: OpDecl) -> list[str]:
    """Attribute types fusionlab can generate, and defaults of the declared type."""
    out: list[str] = []
    for a in decl.attrs:
        if a.type in _OTHER_CANN_ATTR_TYPES:
            out.append(f"attribute {a.name!r}: type {a.type} exists in CANN but fusionlab cannot generate it")
        elif a.type not in ATTR_TYPES:
            close = difflib.get_close_matches(a.type, ATTR_TYPES, n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            out.append(f"attribute {a.name!r}: unknown type {a.type!r}{hint}")
        elif not a.required:
            bad = _default_problem(a)
            if bad:
                out.append(f"attribute {a.name!r}: {bad}")
    return out


def _attr_name_problems(decl: OpDecl) -> list[str]:
    """Rule 2: attribute names (and types) match the built-in ops the declaration fuses."""
    sources = [BUILTINS[t] for t in decl.fused if t in BUILTINS]
    allowed: dict[str, Builtin] = {}
    for b in sources:
        for n in b.attrs:
            allowed.setdefault(n, b)
    out: list[str] = []
    for a in decl.attrs:
        if a.name in allowed:
            want = allowed[a.name].attrs[a.name]
            if a.type in ATTR_TYPES and a.type != want:
                out.append(f"rule 2: attribute {a.name!r} is {want} in the built-in {allowed[a.name].cann}, "
                           f"declared {a.type}")
            continue
        if not sources:
            continue
        hint = _suggest_attr(a.name, allowed)
        owners = "/".join(sorted({b.cann for b in sources}))
        if hint:
            out.append(f"rule 2: attribute {a.name!r} is not a {allowed[hint].cann} attribute: "
                       f"did you mean `{hint}`?")
        else:
            out.append(f"rule 2: attribute {a.name!r} matches no attribute of the fused built-ins ({owners})")
    return out


def _op_name_problems(decl: OpDecl) -> list[str]:
    """Rule 3: the name says what the op fuses; and every fused op maps to a CANN built-in."""
    out: list[str] = []
    name = decl.name
    if name.lower() in _GENERIC_NAMES or re.fullmatch(r"(my|custom|fused|new)?_?op_?\d*", name.lower()):
        suggestion = name_for(decl.fused) if decl.fused else "e.g. ConvRelu"
        out.append(f"rule 3: {name!r} does not say what it fuses; name it after the fused ops, "
                   f"e.g. {suggestion!r}")
    elif decl.fused:
        missing = _name_covers(name, decl.fused)
        if missing:
            out.append(f"rule 3: {name!r} does not mention {', '.join(missing)}; name it after the fused ops, "
                       f"e.g. {name_for(decl.fused)!r}")
    else:
        out.append("rule 3: the declaration does not say which ops it fuses (add .fuses('Conv', 'Relu', ...))")
    unknown_ops = [t for t in decl.fused if t not in BUILTINS]
    if unknown_ops:
        out.append(f"fused op(s) {unknown_ops} have no CANN built-in mapping in fusionlab")
    return out


def problems(decl: OpDecl, end_name: str | None = None) -> list[str]:
    """Every rule the declaration breaks, as human sentences (empty: valid)."""
    return (_macro_problems(decl, end_name) + _tensor_type_problems(decl) + _attr_type_problems(decl)
            + _attr_name_problems(decl) + _op_name_problems(decl))


def _default_problem(a: AttrDesc) -> str | None:
    v = a.default
    scalar = {"Int": (int, np.integer), "Float": (float, int, np.floating, np.integer), "Bool": (bool, np.bool_),
              "String": (str,)}
    if a.type in scalar:
        ok = isinstance(v, scalar[a.type]) and not (a.type == "Int" and isinstance(v, bool))
        return None if ok else f"default {v!r} is not a {a.type}"
    inner = a.type[4:]
    if not isinstance(v, (list, tuple)) or not all(
            isinstance(x, scalar[inner]) and not (inner == "Int" and isinstance(x, bool)) for x in v):
        return f"default {v!r} is not a {a.type}"
    return None


def validate(decl: OpDecl, end_name: str | None = None) -> OpDecl:
    """Return the declaration if it breaks no rule; else raise `DeclarationError` listing them all."""
    found = problems(decl, end_name)
    if found:
        raise DeclarationError(decl.name, found)
    return decl


# --------------------------------------------------------------------------------------------------
# the REG_OP-style builder
# --------------------------------------------------------------------------------------------------

def _types(types) -> tuple:
    if types is None:
        return ()
    if isinstance(types, str):
        types = [types]
    out = []
    for t in types:
        try:
            out.append(canonical_dtype(t))
        except ValueError:
            out.append(str(t))  # kept so validation can report it
    return tuple(out)


class OpBuilder:
    """`reg_op(name).INPUT(...).OUTPUT(...).ATTR(...).OP_END_FACTORY_REG(name)`, as in operator_reg.h."""

    def __init__(self, name: str):
        self._name = name
        self._inputs: list[TensorDesc] = []
        self._outputs: list[TensorDesc] = []
        self._attrs: list[AttrDesc] = []
        self._fused: tuple = ()
        self._folded: tuple = ()
        self._body: list[Step] | None = None

    def _tensor(self, into: list[TensorDesc], name: str, types, param_type: str) -> "OpBuilder":
        """Append one input or output description and continue the chain."""
        into.append(TensorDesc(name, _types(types), param_type))
        return self

    def INPUT(self, name: str, types=None) -> "OpBuilder":
        """A required input and its tensor types."""
        return self._tensor(self._inputs, name, types, "required")

    def OPTIONAL_INPUT(self, name: str, types=None) -> "OpBuilder":
        """An input that may be absent."""
        return self._tensor(self._inputs, name, types, "optional")

    def DYNAMIC_INPUT(self, name: str, types=None) -> "OpBuilder":
        """A variadic input (any number of tensors)."""
        return self._tensor(self._inputs, name, types, "dynamic")

    def OUTPUT(self, name: str, types=None) -> "OpBuilder":
        """A required output and its tensor types."""
        return self._tensor(self._outputs, name, types, "required")

    def DYNAMIC_OUTPUT(self, name: str, types=None) -> "OpBuilder":
        """A variadic output."""
        return self._tensor(self._outputs, name, types, "dynamic")

    def ATTR(self, name: str, type: str, default) -> "OpBuilder":
        """An optional attribute with its CANN type token and default."""
        if isinstance(default, tuple):
            default = list(default)
        self._attrs.append(AttrDesc(name, type, default, False))
        return self

    def REQUIRED_ATTR(self, name: str, type: str) -> "OpBuilder":
        """An attribute every node must set."""
        self._attrs.append(AttrDesc(name, type, None, True))
        return self

    def fuses(self, *op_types: str, folded: Sequence[str] = ()) -> "OpBuilder":
        """Which ONNX ops the kernel computes, in order (a chain), and which were folded away."""
        self._fused = tuple(op_types)
        self._folded = tuple(folded)
        return self

    def body(self, steps: Sequence[Step]) -> "OpBuilder":
        """An explicit computation (for non-chain groups); default: a chain of the fused ops."""
        self._body = list(steps)
        return self

    def OP_END_FACTORY_REG(self, name: str) -> OpDecl:
        """Close the chain: build and validate the declaration (DeclarationError on any broken rule)."""
        decl = OpDecl(self._name, list(self._inputs), list(self._outputs), list(self._attrs), self._fused,
                      self._folded, [])
        validate(decl, name)
        decl.body = self._body if self._body is not None else _chain_body(decl)
        return decl

    # lower-case spellings for Python style
    input = INPUT
    optional_input = OPTIONAL_INPUT
    dynamic_input = DYNAMIC_INPUT
    output = OUTPUT
    dynamic_output = DYNAMIC_OUTPUT
    attr = ATTR
    required_attr = REQUIRED_ATTR
    end = OP_END_FACTORY_REG


def reg_op(name: str) -> OpBuilder:
    """Start a declaration, like `REG_OP(name)`."""
    return OpBuilder(name)


def _chain_body(decl: OpDecl) -> list[Step]:
    """A chain: the first op takes the declared inputs it needs, each next op the previous result."""
    steps: list[Step] = []
    names = [t.name for t in decl.inputs]
    prev = None
    used = 0
    for i, op in enumerate(decl.fused):
        out = decl.outputs[0].name if i == len(decl.fused) - 1 else f"t{i}"
        attrs = tuple(a.name for a in decl.attrs if op in BUILTINS and a.name in BUILTINS[op].attrs)
        arity = {"Conv": len(names) - used if i == 0 else 3}.get(op, 2 if op in ("Add", "Sub", "Mul", "Div", "MatMul")
                                                                   else 1)
        if prev is None:
            ins = tuple(names[used:used + arity])
            used += len(ins)
        else:
            extra = arity - 1
            ins = (prev,) + tuple(names[used:used + extra])
            used += extra
        steps.append(Step(op, ins, out, attrs))
        prev = out
    return steps
