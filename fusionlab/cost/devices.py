"""Device presets for the cost model: four Ascend products from published specs, plus this machine, measured.

The Ascend figures live in `data/devices.json` with a source note each; figures that are derived,
disputed or assumed are listed in the preset's `uncertain` field (see the reference notes,
cann_facts.md sections 3.3 and 4). "this machine" is not a preset: `this_machine()` builds it from
`fusionlab.cost.calibrate` (single-thread matmul GFLOP/s, DRAM streaming bandwidth on arrays >= 4 x the
last-level cache, onnxruntime's per-kernel cost with the profiler off). Every notebook takes this
machine's bandwidth and launch cost from here, so they quote the same quantities.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..text import text_table
from ..timing import machine_info
from . import calibrate as cal

__all__ = ["Device", "DEVICES_JSON", "THIS_MACHINE", "load_devices", "get", "names", "this_machine", "devices_table"]

DEVICES_JSON = Path(__file__).resolve().parents[2] / "data" / "devices.json"
THIS_MACHINE = "this machine"

_FIELDS = ("name", "chip", "peak_fp16_tflops", "peak_int8_tops", "peak_fp32_tflops", "mem_bandwidth_gbs", "ub_kb",
           "l1_kb", "ai_cores", "power_w", "launch_overhead_us", "source", "uncertain")
_OPTIONAL = ("precision", "efficient_transfer_kb", "chips", "vector_cores", "standalone_vector_cores")


@dataclass(frozen=True)
class Device:
    """One target for the roofline model; `uncertain` names the fields that are derived or assumed."""

    name: str
    chip: str
    peak_fp16_tflops: float
    peak_int8_tops: float | None
    peak_fp32_tflops: float | None
    mem_bandwidth_gbs: float
    ub_kb: float
    l1_kb: float
    ai_cores: int
    power_w: float | None
    launch_overhead_us: float
    source: str
    uncertain: list[str] = field(default_factory=list)
    #: precision the device runs a float model in: "fp16" (ATC converts fp32 models for inference) or "fp32"
    precision: str = "fp16"
    #: transfers of at least this many KiB reach the full bandwidth; smaller ones pay a modelled per-transfer
    #: overhead (`fusionlab.analysis.working_set`). 16 KB is Huawei's Ascend C best-practice figure; None: not modelled
    efficient_transfer_kb: float | None = 16.0
    #: chips on the card the figures describe (the 300I Duo is two 310P3): work that runs on one chip, such as
    #: one attention head, sees 1/chips of the peak and of the bandwidth
    chips: int = 1
    #: cores that run a vector (elementwise) kernel, when they are not the AI cores: the 910B splits each AI core
    #: into one cube core (AIC) and two vector cores (AIV), so its vector kernels run on 2 x ai_cores of them
    vector_cores: int | None = None
    #: vector cores beside AI cores that carry their own vector units (the 310P3's 7 per chip, cann_facts.md
    #: s3.3, secondary); descriptive only: the cost model does not spread vector kernels over them
    standalone_vector_cores: int | None = None

    def peak_flops(self, dtype: str = "float32") -> float:
        """Peak FLOP/s for a tensor dtype (fp32 without a published fp32 peak runs at the fp16 cube rate)."""
        if dtype in ("int8", "uint8") and self.peak_int8_tops:
            return self.peak_int8_tops * 1e12
        if dtype in ("float32", "float64") and self.peak_fp32_tflops:
            return self.peak_fp32_tflops * 1e12
        return self.peak_fp16_tflops * 1e12

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return self.mem_bandwidth_gbs * 1e9

    @property
    def chip_bandwidth(self) -> float:
        """One chip's memory bandwidth in bytes/s (the card's, divided over its chips)."""
        return self.bandwidth / self.chips

    def chip_peak_flops(self, dtype: str = "float32") -> float:
        """One chip's peak FLOP/s for a tensor dtype."""
        return self.peak_flops(dtype) / self.chips

    def one_chip(self) -> "Device":
        """The preset as one of its chips sees it: what one model instance runs on.

        A card of several chips (the 300I Duo is two 310P3, each with its own memory) does not run one model
        on both: each chip is a device of its own to the runtime. Peaks, bandwidth, cores and power are divided
        by `chips`; the power share is derived (no per-chip rating is published), so it joins `uncertain`.
        A single-chip preset is returned unchanged.
        """
        if self.chips == 1:
            return self
        n = self.chips
        per = lambda v: None if v is None else v / n  # noqa: E731
        uncertain = list(self.uncertain) + (["power_w"] if self.power_w is not None and "power_w" not in self.uncertain
                                            else [])
        return replace(
            self, name=f"{self.name}, one chip", chip=self.chip.split("x ", 1)[-1].strip(),
            peak_fp16_tflops=self.peak_fp16_tflops / n, peak_int8_tops=per(self.peak_int8_tops),
            peak_fp32_tflops=per(self.peak_fp32_tflops), mem_bandwidth_gbs=self.mem_bandwidth_gbs / n,
            ai_cores=self.ai_cores // n, vector_cores=None if self.vector_cores is None else self.vector_cores // n,
            standalone_vector_cores=(None if self.standalone_vector_cores is None
                                     else self.standalone_vector_cores // n),
            power_w=per(self.power_w), chips=1, uncertain=uncertain,
            source=f"{self.source} One chip of the {n}: every card figure divided by {n} (the power share derived).")

    @property
    def ub_bytes(self) -> int:
        """One AI core's Unified Buffer: what one fused kernel's tiles share (the cost model's default budget)."""
        return int(self.ub_kb * 1024)

    @property
    def buffer_bytes(self) -> int:
        """On-chip capacity a fused kernel can keep intermediates in: (UB + L1) x cores."""
        return int((self.ub_kb + self.l1_kb) * 1024 * self.ai_cores)

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from memory- to compute-bound (fp16 peak)."""
        return self.peak_fp16_tflops * 1e12 / self.bandwidth

    def to_dict(self) -> dict:
        return asdict(self)


def _check(entry: dict, where: str) -> Device:
    missing = [f for f in _FIELDS if f not in entry]
    if missing:
        raise ValueError(f"{where}: device {entry.get('name', '?')!r} lacks fields {missing}")
    unknown = [f for f in entry if f not in _FIELDS + _OPTIONAL]
    if unknown:
        raise ValueError(f"{where}: device {entry['name']!r} has unknown fields {unknown}")
    for f in ("peak_fp16_tflops", "mem_bandwidth_gbs", "ub_kb", "l1_kb", "ai_cores", "launch_overhead_us"):
        if not isinstance(entry[f], (int, float)) or entry[f] <= 0:
            raise ValueError(f"{where}: device {entry['name']!r}: {f} must be a positive number")
    bad = [u for u in entry["uncertain"] if u not in _FIELDS]
    if bad:
        raise ValueError(f"{where}: device {entry['name']!r}: 'uncertain' names unknown fields {bad}")
    return Device(**{**entry, "uncertain": list(entry["uncertain"])})


def load_devices(path: str | Path | None = None) -> dict[str, Device]:
    """{name: Device} for the presets in `data/devices.json` (or `path`), validated."""
    path = Path(path) if path is not None else DEVICES_JSON
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path.name}: cannot read device presets ({exc})") from None
    out: dict[str, Device] = {}
    for entry in data.get("devices", []):
        dev = _check(entry, path.name)
        out[dev.name] = dev
    return out


def names() -> list[str]:
    """Preset names plus 'this machine'."""
    return list(load_devices()) + [THIS_MACHINE]


def this_machine(calibrate: bool = False) -> Device:
    """This CPU as a Device, single-threaded; calibrate=True re-measures, False reuses the process's calibration."""

    c = cal.calibrate(quick=False, refresh=True) if calibrate else cal.calibrate(quick=True)
    gflops = c.matmul_gflops
    return Device(
        name=THIS_MACHINE, chip=machine_info().get("cpu", "cpu"), peak_fp16_tflops=gflops / 1e3, peak_int8_tops=None,
        peak_fp32_tflops=gflops / 1e3, mem_bandwidth_gbs=c.stream_gbs, ub_kb=c.l2_kb, l1_kb=c.l1d_kb, ai_cores=1,
        power_w=None, launch_overhead_us=c.launch_overhead_us,
        source=("measured by fusionlab.cost.calibrate, one thread: numpy fp32 matmul, DRAM streaming copy/add bandwidth "
                "(arrays >= 4 x L3), onnxruntime per-kernel cost with the profiler off; buffer = L2 + L1d of one core"),
        uncertain=[], precision="fp32", efficient_transfer_kb=None,
    )


def get(name: str | Device) -> Device:
    """The device called `name` (case-insensitive; 'this machine' is measured); a helpful error otherwise."""
    if isinstance(name, Device):
        return name
    key = str(name).strip().lower()
    if key in (THIS_MACHINE, "this_machine", "this-machine", "cpu", "host"):
        return this_machine()
    presets = load_devices()
    for dev_name, dev in presets.items():
        if dev_name.lower() == key or dev.chip.lower() == key:
            return dev
    partial = [d for n, d in presets.items() if key and key in n.lower()]
    if len(partial) == 1:
        return partial[0]
    raise ValueError(f"unknown device {name!r}; choose from: {', '.join(names())}")


def devices_table(devices: list[Device] | None = None) -> str:
    """A plain-text table of device figures; uncertain figures carry a '?'."""
    devices = devices if devices is not None else list(load_devices().values())
    cols = [("device", "name", "{}"), ("chip", "chip", "{}"), ("FP16 TFLOPS", "peak_fp16_tflops", "{:g}"),
            ("FP32 TFLOPS", "peak_fp32_tflops", "{:g}"), ("GB/s", "mem_bandwidth_gbs", "{:g}"),
            ("UB KiB", "ub_kb", "{:g}"), ("L1 KiB", "l1_kb", "{:g}"), ("cores", "ai_cores", "{}"),
            ("W", "power_w", "{:g}"), ("launch us", "launch_overhead_us", "{:g}")]
    rows = []
    for d in devices:
        row = []
        for _, f, fmt in cols:
            v = getattr(d, f)
            text = "-" if v is None else fmt.format(round(v, 3) if isinstance(v, float) else v)
            row.append(text + ("?" if f in d.uncertain else ""))
        rows.append(row)
    header = [c[0] for c in cols]
    return "\n".join(text_table(header, rows) + ["? = derived, disputed or assumed (see each preset's source note)"])
