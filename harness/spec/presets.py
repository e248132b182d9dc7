"""Model presets: a model's attention shape (heads, kv heads, head dim, mask), from the table below or a local
transformers config.json, and the cases a suite or the advisor builds from it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.spec.case import AttentionCase, parse_dtype
from harness.spec.masks import parse_mask
from harness.spec.matrices import decode_batch


#: `check --preset`'s small cases: the model's heads, kv heads, head dim and mask at a size the float64 reference
#: and the baseline do in about a second on 2 CPU cores (32 heads x 128 keys x d128)
QUICK_BATCH, QUICK_SEQ = 2, 128


@dataclass(frozen=True)
class ModelShape:
    """One model's attention: `mask` is a parse_mask name (causal for decoders, windowN for sliding windows,
    none for encoders); `source` says where the numbers come from."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    mask: str = "causal"
    source: str = ""
    #: an encoder runs whole sequences at once: no decode cases, default seqs around its patch counts
    encoder: bool = False

    def __post_init__(self):
        AttentionCase(1, self.heads, 1, self.head_dim, "bf16", kv_heads=self.kv_heads)  # the spec's own checks
        parse_mask(self.mask, batch=1, seq_k=1)

    def mask_for(self, seq_q: int, seq_k: int) -> str:
        """The mask name at these lengths: a causal decoder's queries sit at the end of its keys (bottom-right
        alignment) when there are fewer of them, as in decode and chunked prefill."""
        return "causal-br" if self.mask == "causal" and seq_q != seq_k else self.mask

    def case(self, batch: int, seq: int, dtype: str = "bf16", *, seq_q: int | None = None) -> AttentionCase:
        """The model's attention at (batch, seq) in `dtype`; seq_q=1 for one decode step over `seq` cached keys."""
        seq_q = seq if seq_q is None else seq_q
        mask = self.mask_for(seq_q, seq)
        return AttentionCase(batch, self.heads, seq_q, self.head_dim, parse_dtype(dtype), kv_heads=self.kv_heads,
                             seq_k=seq, mask=parse_mask(mask, batch=batch, seq_k=seq, seq_q=seq_q))

    def quick_cases(self, batch: int | None = None, seq: int | None = None) -> list[AttentionCase]:
        """Small cases of this model's attention, for a quick check of a kernel on its shape (QUICK_BATCH x
        QUICK_SEQ unless given): prefill in fp32 and bf16 and, for a decoder, one decode step over `seq` keys."""
        batch, seq = batch or QUICK_BATCH, seq or QUICK_SEQ
        out = [self.case(batch, seq, "fp32"), self.case(batch, seq, "bf16")]
        return out if self.encoder else out + [self.case(batch, seq, "bf16", seq_q=1)]

    def cases(self, dtype: str = "bf16", tokens: int = 16384) -> list[AttentionCase]:
        """A suite's cases for this model: prefill/training at `tokens` tokens a batch over its usual sequence
        lengths, decode steps over long caches (decoders), and bf16 plus fp16 at one length."""
        if self.encoder:
            seqs = (197, 577, 1025)  # ViT-L/16 at 224 px, ViT-L/14 at 336 px, a 448 px /14 grid: patches + CLS
        else:
            seqs = (1024, 2048, 4096, 8192, 16384)
        out = [self.case(max(1, tokens // s), s, dtype) for s in seqs]
        out.append(self.case(max(1, tokens // seqs[1]), seqs[1], "fp16" if dtype != "fp16" else "bf16"))
        if not self.encoder:
            out += [self.case(decode_batch(n), n, dtype, seq_q=1) for n in (4096, 32768, 131072)]
        return out


#: attention shapes from each model's published config.json (Hugging Face hub)
PRESETS: dict[str, ModelShape] = {p.name: p for p in (
    ModelShape("llama-3-8b", 32, 8, 128, source="meta-llama/Meta-Llama-3-8B config.json"),
    ModelShape("llama-3-70b", 64, 8, 128, source="meta-llama/Meta-Llama-3-70B config.json"),
    ModelShape("mistral-7b", 32, 8, 128, "window4096", source="mistralai/Mistral-7B-v0.1 config.json "
                                                                "(sliding_window 4096)"),
    ModelShape("gemma-2-9b", 16, 8, 256, source="google/gemma-2-9b config.json (head_dim 256; its logit softcap "
                                                 "and alternating local layers are not modelled)"),
    ModelShape("qwen2.5-7b", 28, 4, 128, source="Qwen/Qwen2.5-7B config.json"),
    ModelShape("vit-l", 16, 16, 64, "none", source="ViT-L/16 (google/vit-large-patch16-224): 16 heads of 64, "
                                                    "bidirectional", encoder=True),
)}


def get_preset(name: str) -> ModelShape:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
    return PRESETS[name]


def _positive_int(config: dict, key: str, path: Path) -> int:
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{path}: {key}={value!r}: must be an integer >= 1")
    return value


def from_hf_config(path: str | Path) -> ModelShape:
    """A model's attention shape from a local transformers config.json: num_attention_heads,
    num_key_value_heads (default: the same), head_dim (default: hidden_size // heads), sliding_window (when set
    and not switched off by use_sliding_window: false). Read from disk only; nothing is downloaded."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--hf-config {path}: no such file")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: line {exc.lineno}: {exc.msg}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object (a transformers config.json)")
    config = config.get("text_config", config) if "num_attention_heads" not in config else config
    if "num_attention_heads" not in config:
        raise ValueError(f"{path}: no num_attention_heads (not a transformers decoder/encoder config.json?)")
    heads = _positive_int(config, "num_attention_heads", path)
    kv_heads = _positive_int(config, "num_key_value_heads", path) if config.get("num_key_value_heads") else heads
    if config.get("head_dim"):
        head_dim = _positive_int(config, "head_dim", path)
    elif "hidden_size" in config:
        hidden = _positive_int(config, "hidden_size", path)
        if hidden % heads:
            raise ValueError(f"{path}: hidden_size={hidden} is not a multiple of num_attention_heads={heads}; "
                             "give head_dim")
        head_dim = hidden // heads
    else:
        raise ValueError(f"{path}: needs head_dim, or hidden_size to derive it")
    window = config.get("sliding_window")
    use_window = config.get("use_sliding_window", True) is not False
    mask = f"window{_positive_int(config, 'sliding_window', path)}" if window and use_window else "causal"
    # bidirectional encoders: no causal mask, no decode
    encoder = config.get("model_type") in ("vit", "bert", "roberta", "clip_vision_model", "dinov2", "siglip_vision_model")
    name = str(config.get("_name_or_path") or config.get("model_type") or path.parent.name or path.stem)
    try:
        return ModelShape(name, heads, kv_heads, head_dim, "none" if encoder else mask, source=str(path),
                          encoder=encoder)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def quick_cases(preset: str | None, hf_config: str | Path | None, *, batch: int | None = None,
                seq: int | None = None) -> list[AttentionCase] | None:
    """`check`'s cases for --preset/--hf-config (ModelShape.quick_cases), or None when neither is given; a
    --batch or --seq without a model is a ValueError."""
    shape = model_shape(preset, hf_config)
    if shape is None:
        if batch is not None or seq is not None:
            raise ValueError("--batch and --seq size the cases of a --preset or --hf-config; give one of those")
        return None
    return shape.quick_cases(batch, seq)


def model_shape(preset: str | None, hf_config: str | Path | None) -> ModelShape | None:
    """The shape `--preset` or `--hf-config` names (not both), or None."""
    if preset and hf_config:
        raise ValueError("give --preset or --hf-config, not both")
    if preset:
        return get_preset(preset)
    return from_hf_config(hf_config) if hf_config else None

