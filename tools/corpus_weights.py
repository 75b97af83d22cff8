"""Random but trained-looking weights for the export corpus (runs in .corpus-venv/ only: it imports torch).

Default initialisations make poor test models: BatchNorm at identity (mean 0, var 1, gamma 1, beta 0),
LayerNorm at 1/0, and some torchvision nets whose output hardly depends on the input, so that any
rewrite, right or wrong, "verifies". Here every layer gets weights that keep activations of order one,
with per-channel variety, and BatchNorm statistics that are measured, not defaults:

- Conv / Linear / HF Conv1D weights ~ N(0, 1/fan_in), each output channel scaled by exp(U(-0.5, 0.5));
  biases ~ N(0, 0.1);
- Embedding ~ N(0, 1) (a frozen one, Whisper's sinusoidal positions, is left as the library made it);
  LayerNorm/GroupNorm gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1); so are the RMS norms transformers writes as
  modules of their own (LlamaRMSNorm, T5LayerNorm: a class named *Norm with a 1-D weight and no nn base);
- BatchNorm gamma ~ U(0.5, 1.5), beta ~ N(0, 0.2); running mean/var measured on random batches (train-mode
  BatchNorm only, cumulative average, as torch.optim.swa_utils.update_bn does), then moved off the batch
  statistics as real running averages are: mean += N(0, 0.1)·std, var *= U(0.8, 1.25);
- ConvNeXt layer-scale ~ U(0.2, 1.0) (its default 1e-6 makes every block an identity);
- any other trainable tensor (class token, position embeddings) ~ N(0, 0.5); frozen ones (YOLO's DFL
  projection) are left as the library made them.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

METHOD = __doc__.split("\n\n", 1)[1].strip()


def _conv_like(mod: nn.Module) -> tuple[int, int] | None:
    """(fan_in, output axis) of a Conv/Linear/Conv1D weight, or None for other modules."""
    if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
        w = mod.weight
        return int(w[0].numel()), 0
    if type(mod).__name__ == "Conv1D" and hasattr(mod, "weight"):  # transformers' GPT-2 projection: [in, out]
        return int(mod.weight.shape[0]), 1
    return None


def _set_conv_like(mod: nn.Module, fan_in: int, axis: int, g: torch.Generator) -> None:
    w = mod.weight
    scale = torch.exp(torch.empty(w.shape[axis]).uniform_(-0.5, 0.5, generator=g))
    shape = [1] * w.dim()
    shape[axis] = -1
    w.copy_(torch.randn(w.shape, generator=g) / math.sqrt(fan_in) * scale.view(shape))
    if getattr(mod, "bias", None) is not None:
        mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)


def _rms_norm(mod: nn.Module) -> bool:
    """A norm module of a library's own (LlamaRMSNorm, T5LayerNorm): *Norm class, one 1-D weight, no bias."""
    w = getattr(mod, "weight", None)
    return (type(mod).__name__.endswith("Norm") and type(mod).__module__.startswith("transformers.")
            and isinstance(w, nn.Parameter) and w.dim() == 1 and getattr(mod, "bias", None) is None)


def _uniform(t: torch.Tensor, lo: float, hi: float, g: torch.Generator) -> None:
    t.copy_(torch.empty(t.shape).uniform_(lo, hi, generator=g))


def _normal(t: torch.Tensor, std: float, g: torch.Generator) -> None:
    t.copy_(torch.randn(t.shape, generator=g) * std)


def _set_module(mod: nn.Module, g: torch.Generator, kinds: Counter) -> list[torch.Tensor]:
    """Set one module's own parameters; returns those it set."""
    conv = _conv_like(mod)
    if conv is not None and mod.weight.requires_grad:
        _set_conv_like(mod, *conv, g)
        kinds["conv/linear"] += 1
    elif isinstance(mod, nn.Embedding) and mod.weight.requires_grad:
        _normal(mod.weight, 1.0, g)
        kinds["embedding"] += 1
    elif isinstance(mod, (nn.LayerNorm, nn.GroupNorm)) and mod.weight is not None:
        _uniform(mod.weight, 0.5, 1.5, g)
        if mod.bias is not None:
            _normal(mod.bias, 0.1, g)
        kinds["layernorm"] += 1
    elif _rms_norm(mod):
        _uniform(mod.weight, 0.5, 1.5, g)
        kinds["rmsnorm"] += 1
    elif isinstance(mod, _BatchNorm) and mod.weight is not None:
        _uniform(mod.weight, 0.5, 1.5, g)
        _normal(mod.bias, 0.2, g)
        kinds["batchnorm"] += 1
    else:
        return []
    return [p for p in mod.parameters(recurse=False)]


def _set_rest(model: nn.Module, done: set[int], g: torch.Generator, kinds: Counter) -> None:
    for name, p in model.named_parameters():
        if id(p) in done:
            continue
        if not p.requires_grad:
            kinds["left as made (frozen)"] += 1
        elif "layer_scale" in name:
            _uniform(p, 0.2, 1.0, g)
            kinds["layer_scale"] += 1
        else:
            _normal(p, 0.5, g)
            kinds["other N(0, 0.5)"] += 1


def calibrate_batchnorm(model: nn.Module, batches: list[list[torch.Tensor]], g: torch.Generator) -> None:
    """Measure BatchNorm running statistics on `batches` (train-mode BN only), then offset them a little."""
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    if not bns:
        return
    model.eval()
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over the batches
        bn.train()
    with torch.no_grad():
        for args in batches:
            model(*args)
    for bn, momentum in zip(bns, saved):
        bn.momentum = momentum
        bn.eval()
        std = bn.running_var.sqrt()
        bn.running_mean.add_(torch.randn(bn.running_mean.shape, generator=g) * 0.1 * std)
        bn.running_var.mul_(torch.empty(bn.running_var.shape).uniform_(0.8, 1.25, generator=g))


def _stats(model: nn.Module) -> dict:
    """Summary numbers that show the weights are not at their identity defaults."""
    out: dict = {}
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    if bns:
        mean = torch.cat([b.running_mean.abs() for b in bns])
        var = torch.cat([b.running_var for b in bns])
        out["batchnorm"] = {"layers": len(bns), "mean_abs_running_mean": round(float(mean.mean()), 4),
                            "running_var_min": round(float(var.min()), 4),
                            "running_var_median": round(float(var.median()), 4),
                            "running_var_max": round(float(var.max()), 4),
                            "share_var_within_5pct_of_1": round(float(((var - 1).abs() < 0.05).float().mean()), 4)}
    lns = [m for m in model.modules() if isinstance(m, nn.LayerNorm) and m.weight is not None]
    if lns:
        w = torch.cat([m.weight.detach().flatten() for m in lns])
        out["layernorm"] = {"layers": len(lns), "gamma_mean": round(float(w.mean()), 4),
                            "gamma_std": round(float(w.std()), 4)}
    rms = [m for m in model.modules() if _rms_norm(m)]
    if rms:
        w = torch.cat([m.weight.detach().flatten() for m in rms])
        out["rmsnorm"] = {"layers": len(rms), "gamma_mean": round(float(w.mean()), 4),
                          "gamma_std": round(float(w.std()), 4)}
    return out


def trained_looking(model: nn.Module, seed: int, calibration: list[list[torch.Tensor]]) -> dict:
    """Give `model` trained-looking weights in place (seeded); returns how, as JSON-able facts."""
    g = torch.Generator().manual_seed(seed)
    kinds: Counter[str] = Counter()
    done: set[int] = set()
    with torch.no_grad():
        for mod in model.modules():
            done.update(id(p) for p in _set_module(mod, g, kinds))
        _set_rest(model, done, g, kinds)
    calibrate_batchnorm(model, calibration, g)
    model.eval()
    return {"method": "corpus_weights.trained_looking (manifest: weights_method)", "seed": seed,
            "modules_set": dict(sorted(kinds.items())), **_stats(model)}
