"""The architectures of the export corpus, small (committed) and full size (benchmarks), with their inputs.

Runs only in the exporters' environment (.corpus-venv/, made by tools/export_corpus.py): it imports torch,
torchvision, transformers and ultralytics. Each builder returns a `Built`: the module in eval mode with
random but trained-looking weights (`corpus_weights.trained_looking`), how to make example
inputs, which axes are dynamic, and a JSON-able description of the configuration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from corpus_weights import trained_looking

#: name -> (architecture, library)
ARCHITECTURES = {
    "bert": ("BertModel", "transformers"),
    "bert_eager": ("BertModel, eager attention", "transformers"),
    "gpt2": ("GPT2Model", "transformers"),
    "vit": ("ViTModel", "transformers"),
    "convnext": ("ConvNeXt", "torchvision"),
    "mobilenetv3": ("MobileNetV3 (small)", "torchvision"),
    "efficientnet": ("EfficientNet (b0 recipe)", "torchvision"),
    "yolo11": ("YOLO11 DetectionModel", "ultralytics"),
    "googlenet": ("GoogLeNet (Inception v1)", "torchvision"),
    "llama": ("LlamaForCausalLM (grouped-query attention)", "transformers"),
    "t5_encoder": ("T5EncoderModel (gated-gelu)", "transformers"),
    "whisper_encoder": ("WhisperEncoder", "transformers"),
    "swin": ("SwinModel", "transformers"),
    "resnet_fp16": ("ResNet-18 at 1/4 width, float16", "torchvision"),
    "bert_fp16": ("BertModel, float16", "transformers"),
    "bert_eager_fp16": ("BertModel, eager attention, float16", "transformers"),
}


#: the small CNNs' input size: 96 (and YOLO's 160) keep every spatial size distinct from every channel count
#: in the survey's shapes
SMALL_IMAGE = 96


@dataclass
class Built:
    """One model ready to export."""

    module: nn.Module
    make_inputs: Callable[..., dict[str, torch.Tensor]]  # (seed, **dims) -> {input name: tensor}, forward order
    output_names: list[str]
    dynamic: dict[str, dict[int, str]]  # input or output name -> {axis: symbolic dim name}
    config: dict
    weights: dict = field(default_factory=dict)  # how the weights were set, and their statistics
    export_dims: dict[str, int] = field(default_factory=dict)  # sizes of the example inputs traced
    check_dims: list[dict[str, int]] = field(default_factory=list)  # other sizes the export must run at
    #: for a half-precision model: its float32 twin (the same fp16 weights, widened), which the export is
    #: judged against (as fusionlab.verify judges half-precision outputs against a float32 run)
    reference: nn.Module | None = None


class TextModel(nn.Module):
    """BERT-like call (input_ids, attention_mask, token_type_ids) returning a plain tuple of named outputs."""

    def __init__(self, model: nn.Module, keys: list[str]):
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(out[k] for k in self.keys)


class CausalTextModel(TextModel):
    """GPT-2-like call (input_ids, attention_mask)."""

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return tuple(out[k] for k in self.keys)


class AudioModel(TextModel):
    """Whisper-encoder-like call (input_features)."""

    def forward(self, input_features):
        out = self.model(input_features=input_features)
        return tuple(out[k] for k in self.keys)


class VisionModel(TextModel):
    """ViT-like call (pixel_values)."""

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return tuple(out[k] for k in self.keys)


def _tokens(vocab: int, with_types: bool, seq: int) -> Callable[..., dict[str, torch.Tensor]]:
    def make(seed: int, batch: int = 1, sequence: int = seq) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        feeds = {"input_ids": torch.randint(0, vocab, (batch, sequence), generator=g),
                 "attention_mask": torch.ones(batch, sequence, dtype=torch.int64)}
        if with_types:
            feeds["token_type_ids"] = torch.randint(0, 2, (batch, sequence), generator=g)
        return feeds
    return make


def _images(name: str, size: int) -> Callable[..., dict[str, torch.Tensor]]:
    def make(seed: int, batch: int = 1) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {name: torch.randn(batch, 3, size, size, generator=g)}
    return make


def _calibration(make: Callable[..., dict[str, torch.Tensor]], batches: int = 4, size: int = 8):
    """Random batches (of `size` examples each) to measure BatchNorm statistics on: forward arguments."""
    return [list(make(1000 + b, batch=size).values()) for b in range(batches)]


def _hf(wrapper: nn.Module, make, seq: int | None, config: dict, seed: int,
        seq_outputs: tuple[str, ...] = ("last_hidden_state",)) -> Built:
    """A wrapped transformers model: dynamic batch (and sequence, for text), checked at other sizes too."""
    weights = trained_looking(wrapper, seed, [])
    names = list(make(0))
    axes = {0: "batch", 1: "sequence"} if seq else {0: "batch"}
    dynamic = {n: dict(axes) for n in names}
    for k in wrapper.keys:
        dynamic[k] = dict(axes) if k in seq_outputs else {0: "batch"}
    export = {"batch": 2, "sequence": seq} if seq else {"batch": 2}
    checks = [{"batch": 1, "sequence": seq}, {"batch": 3, "sequence": seq // 2}] if seq else [{"batch": 1}, {"batch": 3}]
    return Built(wrapper.eval(), make, list(wrapper.keys), dynamic, config, weights, export, checks)


def bert(full: bool, seed: int, attn: str | None = None) -> Built:
    """transformers BertModel: 2 layers, hidden 128, 4 heads, seq 32 (full: BERT-base, seq 128).

    `attn` = "eager" gives the classic attention form (explicit MatMul / Div / Add mask / Softmax), which
    exports made before transformers defaulted to SDPA have; small then means hidden 64 and 2 heads.
    """
    from transformers import BertConfig, BertModel

    width = dict(hidden_size=64, num_attention_heads=2) if attn else dict(hidden_size=128, num_attention_heads=4)
    kw = {} if full else dict(vocab_size=256, num_hidden_layers=2, intermediate_size=256, max_position_embeddings=64,
                              **width)
    cfg = BertConfig(**kw, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     **({"attn_implementation": attn} if attn else {}))
    model = BertModel(cfg).eval()
    seq = 128 if full else 32
    wrapper = TextModel(model, ["last_hidden_state", "pooler_output"])
    return _hf(wrapper, _tokens(cfg.vocab_size, True, seq), seq, _hf_config(model, kw), seed)


def gpt2(full: bool, seed: int) -> Built:
    """transformers GPT2Model: 2 layers, n_embd 64, 2 heads, seq 32 (full: GPT-2 small, seq 128)."""
    from transformers import GPT2Config, GPT2Model

    kw = {} if full else dict(vocab_size=256, n_embd=64, n_layer=2, n_head=2, n_inner=256, n_positions=64,
                              bos_token_id=255, eos_token_id=255)
    cfg = GPT2Config(**kw, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2Model(cfg).eval()
    seq = 128 if full else 32
    wrapper = CausalTextModel(model, ["last_hidden_state"])
    return _hf(wrapper, _tokens(cfg.vocab_size, False, seq), seq, _hf_config(model, kw), seed)


def vit(full: bool, seed: int) -> Built:
    """transformers ViTModel: 2 layers, hidden 64, 2 heads, 32x32 image, patch 8 (full: ViT-B/16 at 224)."""
    from transformers import ViTConfig, ViTModel

    kw = {} if full else dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=2, intermediate_size=256)
    cfg = ViTConfig(**kw, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = ViTModel(cfg).eval()
    wrapper = VisionModel(model, ["last_hidden_state", "pooler_output"])
    return _hf(wrapper, _images("pixel_values", cfg.image_size), None, _hf_config(model, kw), seed)


def _hf_config(model, kw: dict) -> dict:
    cfg = model.config
    keys = set(kw) | ({"hidden_act", "layer_norm_eps", "layer_norm_epsilon", "activation_function", "use_cache"}
                      & set(cfg.to_dict()))
    out = {k: getattr(cfg, k) for k in sorted(keys)}
    return {"preset": "library defaults" if not kw else "reduced", "class": type(model).__name__,
            "attn_implementation": cfg._attn_implementation, **out}


def _vision(module: nn.Module, size: int, seed: int, config: dict) -> Built:
    make = _images("input", size)
    weights = trained_looking(module, seed, _calibration(make))
    dynamic = {"input": {0: "batch"}, "output": {0: "batch"}}
    return Built(module.eval(), make, ["output"], dynamic, {**config, "image_size": size}, weights,
                 {"batch": 2}, [{"batch": 1}, {"batch": 3}])


def convnext(full: bool, seed: int) -> Built:
    """torchvision ConvNeXt, stages (16, 32, 64, 128) x depths (1, 1, 2, 1), 96x96 (full: convnext_tiny, 224)."""
    from torchvision.models import convnext_tiny
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    if full:
        return _vision(convnext_tiny(), 224, seed, {"builder": "torchvision.models.convnext_tiny()"})
    setting = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, 64, 1), CNBlockConfig(64, 128, 2), CNBlockConfig(128, None, 1)]
    model = ConvNeXt(setting, stochastic_depth_prob=0.0, num_classes=10)
    cfg = {"builder": "ConvNeXt(block_setting)", "block_setting": [[c.input_channels, c.out_channels, c.num_layers]
                                                                   for c in setting], "num_classes": 10}
    return _vision(model, SMALL_IMAGE, seed, cfg)


def mobilenetv3(full: bool, seed: int) -> Built:
    """torchvision mobilenet_v3_small(width_mult=0.5, reduced_tail=True, 10 classes), 96x96 (full: defaults, 224)."""
    from torchvision.models import mobilenet_v3_small

    if full:
        return _vision(mobilenet_v3_small(), 224, seed, {"builder": "torchvision.models.mobilenet_v3_small()"})
    model = mobilenet_v3_small(num_classes=10, width_mult=0.5, reduced_tail=True)
    cfg = {"builder": "mobilenet_v3_small(num_classes=10, width_mult=0.5, reduced_tail=True)"}
    return _vision(model, SMALL_IMAGE, seed, cfg)


def efficientnet(full: bool, seed: int) -> Built:
    """torchvision EfficientNet on the b0 recipe, width 0.25, depth 0.34, 10 classes, 96x96 (full: b0, 224)."""
    from torchvision.models import efficientnet_b0
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    if full:
        return _vision(efficientnet_b0(), 224, seed, {"builder": "torchvision.models.efficientnet_b0()"})
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.34)
    model = EfficientNet(setting, dropout=0.2, stochastic_depth_prob=0.0, num_classes=10, last_channel=last)
    cfg = {"builder": "EfficientNet(_efficientnet_conf('efficientnet_b0', width_mult=0.25, depth_mult=0.34))",
           "num_classes": 10}
    return _vision(model, SMALL_IMAGE, seed, cfg)


def yolo11(full: bool, seed: int) -> Built:
    """ultralytics YOLO11 from yolo11n.yaml (width 0.125, 10 classes, 160x160; full: yolo11n, 80 classes, 640).

    Prepared as ultralytics' own ONNX exporter does: BatchNorm folded by `model.fuse()`, the Detect head
    in export mode, C2f blocks on `forward_split` (no weights can be downloaded: built from the yaml).
    """
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.nn.modules import C2f, Detect
    from ultralytics.nn.tasks import DetectionModel, yaml_model_load

    cfg = yaml_model_load("yolo11n.yaml")
    nc, size = (80, 640) if full else (10, 160)
    if not full:
        depth, _, max_ch = cfg["scales"]["n"]
        cfg = {**cfg, "scales": {"n": [depth, 0.125, max_ch]}, "scale": "n"}
    model = DetectionModel(cfg, nc=nc, verbose=False)
    make = _images("images", size)
    weights = trained_looking(model, seed, _calibration(make))
    for p in model.parameters():
        p.requires_grad = False
    model = model.eval().float().fuse(verbose=False)
    for m in model.modules():
        if isinstance(m, Detect):
            m.dynamic, m.export, m.format, m.shape, m.xyxy = False, True, "onnx", None, False
            m.max_det = min(getattr(m, "max_det", 300), sum((size // int(s)) ** 2 for s in model.stride.tolist()))
        elif isinstance(m, C2f):
            m.forward = m.forward_split
    with torch.no_grad():
        model(*make(0).values())  # ultralytics' exporter makes dry runs too (they set anchors and strides)
    weights["folded"] = "BatchNorm folded into Conv by ultralytics DetectionModel.fuse(), as its exporter does"
    config = {"yaml": "yolo11n.yaml", "scales": cfg["scales"]["n"] if not full else "n", "nc": nc,
              "image_size": size, "detect_head": "export=True, format='onnx', dynamic=False",
              "note": "ultralytics' own exporter would pass opset_version=18 (best_onnx_opset for torch 2.14) and "
                      "the TorchScript exporter; here every model uses each exporter's default opset"}
    return Built(model, make, ["output0"], {}, config, weights, {"batch": 1}, [])


def googlenet(full: bool, seed: int) -> Built:
    """torchvision GoogLeNet at a quarter of every width, 10 classes, 96x96 (full: googlenet(), 224).

    Its Inception blocks (three 1x1 convolutions side by side on one input) are where horizontal fusion
    applies. No auxiliary heads (they only train); BatchNorm eps 1e-3 as torchvision has it.
    """
    from torchvision.models import googlenet as tv_googlenet
    from torchvision.models.googlenet import BasicConv2d, GoogLeNet, Inception, InceptionAux

    if full:
        model = tv_googlenet(weights=None, aux_logits=False, init_weights=False)
        return _vision(model, 224, seed, {"builder": "torchvision.models.googlenet(aux_logits=False)"})

    def quarter(in_channels: int, out_channels: int, **kw) -> BasicConv2d:
        return BasicConv2d(in_channels if in_channels == 3 else in_channels // 4, out_channels // 4, **kw)

    def inception(*channels: int) -> Inception:
        return Inception(*channels, conv_block=quarter)

    model = GoogLeNet(num_classes=10, aux_logits=False, init_weights=False, blocks=[quarter, inception, InceptionAux])
    model.fc = torch.nn.Linear(1024 // 4, 10)
    cfg = {"builder": "GoogLeNet(num_classes=10, aux_logits=False, blocks=[BasicConv2d at 1/4 width, ...])",
           "num_classes": 10}
    return _vision(model, SMALL_IMAGE, seed, cfg)


def llama(full: bool, seed: int) -> Built:
    """transformers LlamaForCausalLM: 2 layers, hidden 64, 4 query heads sharing 2 key/value heads (GQA), SwiGLU
    intermediate 128, rotary embeddings, RMSNorm, causal mask, seq 32 (full: SmolLM2-135M's shape, seq 128)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
              num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True) if full else \
        dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
    cfg = LlamaConfig(**kw, use_cache=False, attention_dropout=0.0, bos_token_id=1, eos_token_id=2,
                      pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    seq = 128 if full else 32
    wrapper = CausalTextModel(model, ["logits"])
    return _hf(wrapper, _tokens(cfg.vocab_size, False, seq), seq, _hf_config(model, kw), seed, ("logits",))


def t5_encoder(full: bool, seed: int) -> Built:
    """transformers T5EncoderModel, T5 v1.1's gated-gelu feed-forward: 2 layers, d_model 64, 4 heads of 16,
    d_ff 128, 32 relative-position buckets, seq 32 (full: flan-t5-small's encoder, seq 128)."""
    from transformers import T5Config, T5EncoderModel

    kw = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=1024, num_layers=8, num_heads=6,
              feed_forward_proj="gated-gelu") if full else \
        dict(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
             relative_attention_num_buckets=32, relative_attention_max_distance=64, feed_forward_proj="gated-gelu")
    cfg = T5Config(**kw, dropout_rate=0.0, use_cache=False, is_encoder_decoder=False)
    model = T5EncoderModel(cfg).eval()
    seq = 128 if full else 32
    wrapper = CausalTextModel(model, ["last_hidden_state"])
    return _hf(wrapper, _tokens(cfg.vocab_size, False, seq), seq, _hf_config(model, kw), seed)


def whisper_encoder(full: bool, seed: int) -> Built:
    """transformers WhisperEncoder: conv front end (two Conv1d + GELU), sinusoidal positions, 2 layers, d_model 64,
    4 heads (Q pre-scaled by head_dim^-1/2), 16 mel bins x 64 frames (full: whisper-tiny's encoder, 80 x 3000).

    Whisper's encoder accepts only its full input length (2 x max_source_positions frames): batch is the
    one dynamic axis."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    kw = dict(num_mel_bins=80, d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
              max_source_positions=1500) if full else \
        dict(num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
             max_source_positions=32)
    cfg = WhisperConfig(**kw, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0)
    model = WhisperEncoder(cfg).eval()
    frames = 2 * cfg.max_source_positions

    def make(seed: int, batch: int = 1) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {"input_features": torch.randn(batch, cfg.num_mel_bins, frames, generator=g)}

    wrapper = AudioModel(model, ["last_hidden_state"])
    return _hf(wrapper, make, None, {**_hf_config(model, kw), "frames": frames}, seed)


def swin(full: bool, seed: int) -> Built:
    """transformers SwinModel: 32x32 image, patch 2, embed 16, depths (2, 2, 2), heads (2, 4, 8), window 4
    (stages at 16x16 and 8x8 shift every second block; 4x4 is one window, unshifted) (full: swin-tiny, 224)."""
    from transformers import SwinConfig, SwinModel

    kw = {} if full else dict(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2, 2], num_heads=[2, 4, 8],
                              window_size=4)
    cfg = SwinConfig(**kw, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    model = SwinModel(cfg).eval()
    wrapper = VisionModel(model, ["last_hidden_state", "pooler_output"])
    return _hf(wrapper, _images("pixel_values", cfg.image_size), None, _hf_config(model, kw), seed)


def _half(built: Built) -> Built:
    """`built` in float16, with its float32 twin (the fp16-rounded weights, widened) as the reference."""
    import copy

    half = built.module.half().eval()
    built.reference = copy.deepcopy(half).float().eval()
    make32 = built.make_inputs

    def make(seed: int, **dims) -> dict[str, torch.Tensor]:
        return {k: v.half() if v.is_floating_point() else v for k, v in make32(seed, **dims).items()}

    built.module, built.make_inputs = half, make
    built.config = {**built.config, "dtype": "float16 (module.half() after setting the weights)"}
    return built


def resnet_fp16(full: bool, seed: int) -> Built:
    """torchvision ResNet-18 (BasicBlock, [2, 2, 2, 2]) at a quarter of every width, 10 classes, 96x96, in float16
    (full: resnet18(), 224). BatchNorm statistics are measured in float32, then the model is halved."""
    from torchvision.models import resnet18
    from torchvision.models.resnet import BasicBlock, ResNet

    if full:
        return _half(_vision(resnet18(), 224, seed, {"builder": "torchvision.models.resnet18()"}))
    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
    model.inplanes = 16
    model.conv1 = nn.Conv2d(3, 16, kernel_size=7, stride=2, padding=3, bias=False)
    model.bn1 = nn.BatchNorm2d(16)
    model.layer1 = model._make_layer(BasicBlock, 16, 2)
    model.layer2 = model._make_layer(BasicBlock, 32, 2, stride=2)
    model.layer3 = model._make_layer(BasicBlock, 64, 2, stride=2)
    model.layer4 = model._make_layer(BasicBlock, 128, 2, stride=2)
    model.fc = nn.Linear(128, 10)
    cfg = {"builder": "ResNet(BasicBlock, ...) with ResNet._make_layer at widths (16, 32, 64, 128) x 2 blocks",
           "num_classes": 10}
    return _half(_vision(model, SMALL_IMAGE, seed, cfg))


def bert_fp16(full: bool, seed: int) -> Built:
    """The `bert` model (2 layers, hidden 128, 4 heads, SDPA attention, seq 32) in float16 (`bert_eager_fp16`: the
    `bert_eager` one, hidden 64, 2 heads, eager attention)."""
    return _half(bert(full, seed))


BUILDERS: dict[str, Callable[[bool, int], Built]] = {
    "bert": bert, "bert_eager": lambda full, seed: bert(full, seed, "eager"), "gpt2": gpt2, "vit": vit,
    "convnext": convnext, "mobilenetv3": mobilenetv3,
    "efficientnet": efficientnet, "yolo11": yolo11, "googlenet": googlenet,
    "llama": llama, "t5_encoder": t5_encoder, "whisper_encoder": whisper_encoder, "swin": swin,
    "resnet_fp16": resnet_fp16, "bert_fp16": bert_fp16,
    "bert_eager_fp16": lambda full, seed: _half(bert(full, seed, "eager")),
}
