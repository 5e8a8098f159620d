"""The model zoo: programs this project did not write, built small and run unchanged.

Each `Case` builds a model on the CPU with random weights (seeded, so every
build is identical) and the inputs of one training step. The harness
(`harness.py`) runs it on the CPU as the oracle and on tpu in each mode.

Choices that keep CPU and tpu comparable:
- transformers models run in `eval()`: their dropout is functional and
  reads the config, and tpu's random numbers differ from the CPU's by design.
  Backward and the optimizer step do not care about the module's mode.
- Vision models run in `train()` (BatchNorm's batch statistics and running
  buffers are part of what is tested) with their dropout set to 0. CNNs with
  BatchNorm get 64x64 images: at 32x32 their last stage is 1x1, BatchNorm
  normalises two numbers per channel, and its backward amplifies float
  rounding (0.5% relative error in resnet18's gradients on either side).
- The detection model runs in `eval()` (its training path samples anchors
  with `randperm`), forward only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torchvision_shim
from torch import nn
from torch.nn import functional as F

torchvision_shim.install()


@dataclass(frozen=True)
class Built:
    model: nn.Module
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    name: str
    source: str  # transformers | torchvision | timm | torch
    build: Callable[[], Built]
    train: bool = True  # forward, backward and AdamW step; False: eval forward only
    generate: bool = False  # greedy generate() compared token for token
    note: str = ""


def loss_of(output) -> torch.Tensor:
    """The scalar a step minimises: the model's own loss if it computed one."""
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    tensors = [t for t in flat_tensors(output) if t.is_floating_point() or t.is_complex()]
    return sum(t.abs().square().float().mean() for t in tensors)


def flat_tensors(value) -> list[torch.Tensor]:
    """Every tensor in a (nested) output: ModelOutput, dict, list, tuple."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):  # transformers' ModelOutput is an OrderedDict
        return [t for v in value.values() for t in flat_tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flat_tensors(v)]
    return []  # a transformers Cache, None, a number


# ---------------------------------------------------------------- transformers

VOCAB = 128
TOKENS = (2, 8)


def _lm_inputs() -> dict:
    ids = torch.randint(3, VOCAB, TOKENS)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _hf(model_cls: str, config_cls: str, inputs: Callable[[], dict], **config):
    def build() -> Built:
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, model_cls)(cfg).eval()
        return Built(model, kwargs=inputs())

    return build


_SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=64)  # fmt: skip


def _lm(name, model_cls, config_cls, tied, note="", inputs=_lm_inputs, **config) -> Case:
    config = {**config, "tie_word_embeddings": tied}
    return Case(
        f"{name} ({'tied' if tied else 'untied'})",
        "transformers",
        _hf(model_cls, config_cls, inputs, **config),
        generate=True,
        note=note,
    )


def _classifier_inputs() -> dict:
    ids = torch.randint(3, VOCAB, TOKENS)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # a padded sequence
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1])}


def _seq2seq_inputs() -> dict:
    return {"input_ids": torch.randint(3, VOCAB, TOKENS), "labels": torch.randint(3, VOCAB, (2, 5))}


def _image_inputs() -> dict:
    return {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([1, 3])}


def _speech_ctc_inputs() -> dict:
    return {"input_values": torch.randn(2, 1600), "labels": torch.randint(1, 16, (2, 4))}


def _whisper_inputs() -> dict:
    return {"input_features": torch.randn(2, 16, 32), "labels": torch.randint(3, VOCAB, (2, 5))}


def _clip_inputs() -> dict:
    ids = torch.randint(3, VOCAB, TOKENS)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # a padded caption
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.randn(2, 3, 32, 32),
            "return_loss": True}  # fmt: skip


def _moe_inputs() -> dict:
    """A language model's, with the router's load-balancing loss added to the loss (asked
    for by the call, not the config: with it in the config, generate() fails on the CPU
    in transformers' load_balancing_loss_func)."""
    return {**_lm_inputs(), "output_router_logits": True}


# mixture of experts: top-2 of 4 experts
_MOE = dict(num_key_value_heads=2, num_experts_per_tok=2, inputs=_moe_inputs, **_SMALL)


TRANSFORMERS = [
    _lm("gpt2", "GPT2LMHeadModel", "GPT2Config", True,
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    _lm("llama", "LlamaForCausalLM", "LlamaConfig", False, num_key_value_heads=2, **_SMALL),
    _lm("mistral", "MistralForCausalLM", "MistralConfig", False, num_key_value_heads=2,
        sliding_window=4, **_SMALL),
    _lm("qwen2", "Qwen2ForCausalLM", "Qwen2Config", True, num_key_value_heads=2, **_SMALL),
    _lm("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", False, **_SMALL),
    _lm("opt", "OPTForCausalLM", "OPTConfig", True, vocab_size=VOCAB, hidden_size=32,
        num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32,
        max_position_embeddings=64),
    _lm("phi", "PhiForCausalLM", "PhiConfig", False, **_SMALL),
    _lm("gemma", "GemmaForCausalLM", "GemmaConfig", True, num_key_value_heads=1, head_dim=8,
        **_SMALL),
    Case("bert classifier", "transformers",
         _hf("BertForSequenceClassification", "BertConfig", _classifier_inputs, **_SMALL)),
    Case("t5 (encoder-decoder)", "transformers",
         _hf("T5ForConditionalGeneration", "T5Config", _seq2seq_inputs, vocab_size=VOCAB,
             d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)),
    Case("bart (encoder-decoder)", "transformers",
         _hf("BartForConditionalGeneration", "BartConfig", _seq2seq_inputs, vocab_size=VOCAB,
             d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
             max_position_embeddings=64)),
    Case("vit classifier", "transformers",
         _hf("ViTForImageClassification", "ViTConfig", _image_inputs, image_size=32, patch_size=8,
             hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             num_labels=10)),
    Case("wav2vec2 ctc (speech)", "transformers",
         _hf("Wav2Vec2ForCTC", "Wav2Vec2Config", _speech_ctc_inputs, vocab_size=16,
             hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
             mask_time_prob=0.0, ctc_loss_reduction="mean")),
    Case("whisper (speech)", "transformers",
         _hf("WhisperForConditionalGeneration", "WhisperConfig", _whisper_inputs,
             vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
             decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32,
             decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             begin_suppress_tokens=None, suppress_tokens=None)),
    _lm("mixtral", "MixtralForCausalLM", "MixtralConfig", False, num_local_experts=4, **_MOE),
    _lm("qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig", True, num_experts=4,
        moe_intermediate_size=32, shared_expert_intermediate_size=64,
        experts_implementation="eager", **_MOE),
    _lm("bloom", "BloomForCausalLM", "BloomConfig", True, vocab_size=VOCAB, hidden_size=32,
        n_layer=2, n_head=4),
    Case("deberta_v2 classifier", "transformers",
         _hf("DebertaV2ForSequenceClassification", "DebertaV2Config", _classifier_inputs,
             relative_attention=True, position_buckets=4, max_relative_positions=16,
             pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
             position_biased_input=False, conv_kernel_size=3, **_SMALL)),
    Case("clip (contrastive)", "transformers",
         _hf("CLIPModel", "CLIPConfig", _clip_inputs, projection_dim=16,
             text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4,
                              max_position_embeddings=16),
             vision_config=dict(image_size=32, patch_size=8, hidden_size=32,
                                intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4))),
]  # fmt: skip


# ---------------------------------------------------------------- torchvision and timm


def _images(batch: int = 2, size: int = 32) -> tuple:
    return (torch.randn(batch, 3, size, size),)


def _vision(factory: Callable[[], nn.Module], size: int = 32) -> Callable[[], Built]:
    def build() -> Built:
        return Built(factory().train(), args=_images(size=size))

    return build


def _torchvision(name: str, **kwargs) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=10, **kwargs)

    return make


def _torchvision_vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                              hidden_dim=32, mlp_dim=64, num_classes=10)  # fmt: skip
    # torchvision starts the classifier at zero (for fine-tuning): the outputs, the loss
    # and every gradient were zero, and the cell compared no forward and no backward
    nn.init.normal_(model.heads.head.weight, std=0.5)
    return model


def _torchvision_swin() -> nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer

    # 64x64 images: 16x16 then 8x8 patches, so both stages have several 4x4 windows and
    # the second block of each shifts them (torch.roll and the shifted-window mask)
    return SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
        stochastic_depth_prob=0.0, num_classes=10,
    )  # fmt: skip


def _segmentation() -> nn.Module:
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    return lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3)


def _detection() -> Built:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    model = fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=5, min_size=64, max_size=64
    )
    images = [torch.rand(3, 64, 64), torch.rand(3, 48, 64)]
    # Random weights under BatchNorm's initial statistics shrank the backbone's features
    # to 1e-8: every detection had the same score and nothing the backbone computed could
    # show in the outputs. Statistics of these images (what a trained model's are for
    # its data) keep its features near unit scale.
    for norm in model.modules():
        if isinstance(norm, nn.BatchNorm2d):
            norm.momentum = None  # (a cumulative average: one pass sets them)
    model.backbone.train()
    with torch.no_grad():
        model.backbone(model.transform(images)[0].tensors)
    return Built(model.eval(), args=(images,))


def _timm(name: str, **kwargs) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)

    return make


VISION = [
    Case("resnet18", "torchvision", _vision(_torchvision("resnet18"), size=64)),
    Case("mobilenet_v3_small", "torchvision",
         _vision(_torchvision("mobilenet_v3_small", dropout=0.0), size=64)),
    Case("efficientnet_b0", "torchvision",
         _vision(_torchvision("efficientnet_b0", dropout=0.0, stochastic_depth_prob=0.0),
                 size=64)),
    Case("vit (torchvision)", "torchvision", _vision(_torchvision_vit)),
    Case("fasterrcnn_mobilenet_v3 (eval)", "torchvision", _detection, train=False),
    Case("swin (torchvision)", "torchvision", _vision(_torchvision_swin, size=64)),
    # 128x128: at 64x64 its last stages are 4x4 and 2x2 and BatchNorm amplified rounding
    # until CPU and tpu each missed float64 by 1e-4 in stage2's gradients (tpu 1.6x CPU's,
    # 0.9-1.0 of the tolerance); at 128x128 tpu is the closer (0.85x CPU's error, median)
    Case("shufflenet_v2_x0_5", "torchvision",
         _vision(_torchvision("shufflenet_v2_x0_5"), size=128)),
    Case("lraspp_mobilenet_v3 (segmentation)", "torchvision", _vision(_segmentation, size=64),
         note="slow: about 5 minutes for its three cells on 2 cores (MobileNetV3-Large's 3M"
              " parameters, 1.4 s a step on the CPU, and a 30 s first step on tpu)"),
    Case("convnext_atto", "timm", _vision(_timm("convnext_atto", depths=(1, 1, 1, 1)))),
    Case("deit_tiny", "timm",
         _vision(_timm("deit_tiny_patch16_224", img_size=32, patch_size=8, depth=2))),
]  # fmt: skip


# ---------------------------------------------------------------- plain PyTorch


class RecurrentTagger(nn.Module):
    """Embedding, a two-layer bidirectional recurrent layer, a linear head."""

    def __init__(self, cell: type[nn.Module]):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.rnn = cell(16, 24, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(48, 5)

    def forward(self, tokens):
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


class SelfAttention(nn.Module):
    """nn.MultiheadAttention over a padded batch."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.norm = nn.LayerNorm(32)

    def forward(self, x, padding):
        out, weights = self.attn(x, x, x, key_padding_mask=padding)
        return self.norm(out + x), weights


class SdpaBlock(nn.Module):
    """F.scaled_dot_product_attention, causal and with a boolean mask."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 32)

    def forward(self, x, mask):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out((causal + masked).transpose(1, 2).reshape(b, t, 32))


class SpectralFilter(nn.Module):
    """torch.fft: a learned filter applied in the frequency domain."""

    def __init__(self):
        super().__init__()
        self.filter = nn.Parameter(torch.randn(17, dtype=torch.complex64))
        self.mix = nn.Linear(32, 8)

    def forward(self, x):
        spectrum = torch.fft.rfft(x, dim=-1) * self.filter
        smooth = torch.fft.irfft(spectrum, n=32, dim=-1)
        power = torch.fft.fft2(x.to(torch.complex64)).abs()
        return self.mix(smooth + power)


def _plain(make: Callable[[], nn.Module], *inputs: Callable[[], torch.Tensor]):
    def build() -> Built:
        return Built(make(), args=tuple(f() for f in inputs))

    return build


def _padding() -> torch.Tensor:
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, -2:] = True
    return pad


def _attn_mask() -> torch.Tensor:
    return (torch.rand(6, 6) > 0.3) | torch.eye(6, dtype=torch.bool)


PLAIN = [
    Case("lstm", "torch",
         _plain(lambda: RecurrentTagger(nn.LSTM), lambda: torch.randint(0, 50, (2, 7)))),
    Case("gru", "torch",
         _plain(lambda: RecurrentTagger(nn.GRU), lambda: torch.randint(0, 50, (2, 7)))),
    Case("multihead_attention", "torch",
         _plain(SelfAttention, lambda: torch.randn(2, 6, 32), _padding)),
    Case("scaled_dot_product_attention", "torch",
         _plain(SdpaBlock, lambda: torch.randn(2, 6, 32), _attn_mask)),
    Case("fft", "torch", _plain(SpectralFilter, lambda: torch.randn(2, 4, 32))),
]  # fmt: skip

CASES: dict[str, Case] = {case.name: case for case in TRANSFORMERS + VISION + PLAIN}
