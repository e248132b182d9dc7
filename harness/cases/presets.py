"""Model presets: a model's attention shape from the table below or a local config.json, and its cases."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from harness.cases.case import CASE_SOURCES, AttentionCase, paged_case, parse_dtype
from harness.cases.masks import MaskSpec, SlidingWindow, parse_mask
from harness.cases.matrices import decode_batch
from harness.cases.serving_step import serving_step

#: `check --preset`'s size: the float64 reference and the baseline do it in about a second on 2 CPU cores
#: check's default cases of a model: its fp32 prefill (one sequence) and decode step over QUICK_TAIL_SEQ keys - past
#: 128 and no multiple of any tile (16 to 128), so a kernel that drops its last partial block of keys fails there -,
#: its bf16 prefill over QUICK_SEQ, whole tiles (issue 67: 128 alone passed a kernel that lost its tail)
QUICK_BATCH, QUICK_SEQ, QUICK_TAIL_SEQ = 2, 128, 201


def check_window(mask: MaskSpec | None, seq: int) -> MaskSpec | None:
    """The model's mask at a check's length: a window longer than seq // 2 (which would not bite) becomes seq // 4."""
    if isinstance(mask, SlidingWindow) and (mask.left < 0 or mask.left > seq // 2):
        return SlidingWindow(max(1, seq // 4), mask.right, scaled_from=mask.left if mask.left > 0 else None)
    return mask


@dataclass(frozen=True)
class ModelShape:
    """One model's attention: `mask` is a parse_mask name; softcap, sinks and head_dim_v the case spec's modifiers;
    `local_window` N: the model alternates local layers (windowN) with global ones (`mask`), its cases run both."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    mask: str = "causal"
    source: str = ""
    #: an encoder runs whole sequences at once: no decode cases, default seqs around its patch counts
    encoder: bool = False
    softcap: float | None = None
    sinks: bool = False
    head_dim_v: int | None = None
    local_window: int | None = None
    #: config fields about attention that were read but not modelled (from_hf_config says which)
    not_understood: tuple[str, ...] = ()

    def __post_init__(self):
        AttentionCase(1, self.heads, 1, self.head_dim, "bf16", kv_heads=self.kv_heads, softcap=self.softcap,
                      sinks=self.sinks, head_dim_v=self.head_dim_v)  # the spec's own checks
        for mask in self.layer_masks:
            parse_mask(mask, batch=1, seq_k=1)

    @property
    def layer_masks(self) -> tuple[str, ...]:
        return (self.mask,) if self.local_window is None else (f"window{self.local_window}", self.mask)

    def mask_for(self, seq_q: int, seq_k: int, layer_mask: str | None = None) -> str:
        """The mask name at these lengths: causal is bottom-right aligned when seq_q != seq_k (decode, chunks)."""
        mask = self.mask if layer_mask is None else layer_mask
        return "causal-br" if mask == "causal" and seq_q != seq_k else mask

    def case(self, batch: int, seq: int, dtype: str = "bf16", *, seq_q: int | None = None,
             layer_mask: str | None = None) -> AttentionCase:
        """The model's attention at (batch, seq) in `dtype`, of one layer kind; seq_q=1: a decode step over `seq`."""
        seq_q = seq if seq_q is None else seq_q
        mask = parse_mask(self.mask_for(seq_q, seq, layer_mask), batch=batch, seq_k=seq, seq_q=seq_q)
        return AttentionCase(batch, self.heads, seq_q, self.head_dim, parse_dtype(dtype), kv_heads=self.kv_heads,
                             seq_k=seq, mask=mask, softcap=self.softcap, sinks=self.sinks, head_dim_v=self.head_dim_v)

    def quick_cases(self, batch: int | None = None, seq: int | None = None) -> list[AttentionCase]:
        """Small cases of every layer kind: prefill in fp32 and bf16, and a decoder's decode step; by default over
        QUICK_TAIL_SEQ and QUICK_SEQ keys (a tail and whole tiles), else all at `seq`."""
        tail = seq or QUICK_TAIL_SEQ
        one = batch or 1  # the fp32 prefill over the tail: one sequence, so the three cost what 2 x 128 did
        batch, seq = batch or QUICK_BATCH, seq or QUICK_SEQ
        kinds = [("fp32", None, one, tail), ("bf16", None, batch, seq)] + \
            ([] if self.encoder else [("bf16", 1, batch, tail)])   # (dtype, seq_q, batch, keys)
        cases = [self.case(b, n, dtype, seq_q=q, layer_mask=layer) for layer in self.layer_masks
                 for dtype, q, b, n in kinds]
        return [replace(c, mask=check_window(c.mask, c.seq_k)) for c in cases]

    def cases(self, dtype: str = "bf16", tokens: int = 16384) -> list[AttentionCase]:
        """A suite's cases for every layer kind: prefill at `tokens` tokens a batch, decode and paged serving."""
        # an encoder's: ViT-L/16 at 224 px, ViT-L/14 at 336 px, a 448 px /14 grid (patches + CLS)
        seqs = (197, 577, 1025) if self.encoder else (1024, 2048, 4096, 8192, 16384)
        out = []
        for layer in self.layer_masks:
            out += [self.case(max(1, tokens // s), s, dtype, layer_mask=layer) for s in seqs]
            out.append(self.case(max(1, tokens // seqs[1]), seqs[1], "fp16" if dtype != "fp16" else "bf16",
                                 layer_mask=layer))
            if not self.encoder:
                out += [self.case(decode_batch(n), n, dtype, seq_q=1, layer_mask=layer) for n in (4096, 32768, 131072)]
        # paged cases are plain causal (a window would be lost) and take no modifiers yet
        plain = self.softcap is None and not self.sinks and self.head_dim_v in (None, self.head_dim)
        if not self.encoder and self.mask == "causal" and self.local_window is None and plain:
            shape = dict(heads=self.heads, head_dim=self.head_dim, dtype=parse_dtype(dtype), kv_heads=self.kv_heads)
            out += [paged_case(decode_batch(32768), seq_q=q, **shape, cache=32768, page_size=p)
                    for q in (1, 4, 8) for p in (16, 256)]
            out.append(serving_step(**shape, cache=32768, page_size=16))
        return list(dict.fromkeys(out))


#: attention shapes from each model's published config.json (Hugging Face hub)
PRESETS: dict[str, ModelShape] = {p.name: p for p in (
    ModelShape("llama-3-8b", 32, 8, 128, source="meta-llama/Meta-Llama-3-8B config.json"),
    ModelShape("llama-3-70b", 64, 8, 128, source="meta-llama/Meta-Llama-3-70B config.json"),
    ModelShape("mistral-7b", 32, 8, 128, "window4096", source="mistralai/Mistral-7B-v0.1 config.json "
                                                                "(sliding_window 4096)"),
    ModelShape("gemma-2-9b", 16, 8, 256, softcap=50.0, local_window=4096,
               source="google/gemma-2-9b config.json (head_dim 256, attn_logit_softcapping 50.0, sliding_window 4096 "
                      "on every other layer)"),
    ModelShape("gpt-oss-20b", 64, 8, 64, sinks=True, local_window=128,
               source="openai/gpt-oss-20b config.json (head_dim 64, sliding_window 128 on alternating layer_types; "
                      "a learned sink per head, transformers GptOssAttention)"),
    ModelShape("deepseek-v3", 128, 128, 192, head_dim_v=128,
               source="deepseek-ai/DeepSeek-V3 config.json (MLA: qk_nope_head_dim 128 + qk_rope_head_dim 64, "
                      "v_head_dim 128; the kernel sees the decompressed heads)"),
    ModelShape("qwen2.5-7b", 28, 4, 128, source="Qwen/Qwen2.5-7B config.json"),
    ModelShape("vit-l", 16, 16, 64, "none", source="ViT-L/16 (google/vit-large-patch16-224): 16 heads of 64, "
                                                    "bidirectional", encoder=True),
)}


def get_preset(name: str) -> ModelShape:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
    return PRESETS[name]


#: config fields that set the shape, and attention-looking ones outside the kernel (projection biases, positions
#: applied to q/k, MLA's compressed projections, the LM head's softcap, dropout)
UNDERSTOOD = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "sliding_window",
                        "use_sliding_window", "layer_types", "sliding_window_pattern", "attn_logit_softcapping",
                        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "sliding_window_size"})
OUTSIDE_THE_KERNEL = frozenset({"attention_bias", "attention_dropout", "rope_theta", "rope_scaling", "rope_interleave",
                                "partial_rotary_factor", "final_logit_softcapping", "kv_lora_rank", "q_lora_rank",
                                "max_window_layers", "rope_local_base_freq", "head_dim_original"})
_ATTENTION_FIELD = re.compile(r"attn|attention|window|softcap|head_dim|sink|alibi|rope|lora|scalar|bias")
#: transformers' gpt-oss attention always has one learned sink per head (GptOssAttention.sinks)
SINK_MODELS = ("gpt_oss",)
#: bidirectional encoders: no causal mask, no decode
ENCODER_TYPES = ("vit", "bert", "roberta", "clip_vision_model", "dinov2", "siglip_vision_model")


def _layer_kinds(config: dict) -> set[str] | None:
    """The kinds in layer_types, or the alternation transformers derives (Gemma2Config, Gemma3Config)."""
    if isinstance(config.get("layer_types"), list):
        return set(config["layer_types"])
    if config.get("sliding_window_pattern"):
        return {"sliding_attention", "full_attention"} if int(config["sliding_window_pattern"]) > 1 else None
    return {"sliding_attention", "full_attention"} if config.get("model_type") == "gemma2" else None


def from_hf_config(path: str | Path) -> ModelShape:
    """A model's attention shape from a local transformers config.json (read from disk only). Attention fields it
    does not model are listed in `not_understood` and warned about, not guessed."""
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

    def positive(key: str) -> int:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{path}: {key}={value!r}: must be an integer >= 1")
        return value

    heads = positive("num_attention_heads")
    kv_heads = positive("num_key_value_heads") if config.get("num_key_value_heads") else heads
    head_dim_v = None
    if config.get("qk_nope_head_dim") is not None and config.get("qk_rope_head_dim") is not None:  # MLA
        head_dim = positive("qk_nope_head_dim") + positive("qk_rope_head_dim")
        head_dim_v = positive("v_head_dim") if config.get("v_head_dim") is not None else None
    elif config.get("head_dim") is not None:  # a head_dim of 0 is refused, not replaced by hidden_size // heads
        head_dim = positive("head_dim")
    elif "hidden_size" in config:
        hidden = positive("hidden_size")
        if hidden % heads:
            raise ValueError(f"{path}: hidden_size={hidden} is not a multiple of num_attention_heads={heads}; "
                             "give head_dim")
        head_dim = hidden // heads
    else:
        raise ValueError(f"{path}: needs head_dim, or hidden_size to derive it")
    softcap = config.get("attn_logit_softcapping")
    use_window = bool(config.get("sliding_window")) and config.get("use_sliding_window", True) is not False
    kinds = _layer_kinds(config) if use_window else None
    mask, local_window = "causal", None
    if use_window and (kinds is None or kinds == {"sliding_attention"}):
        mask = f"window{positive('sliding_window')}"                             # every layer local (Mistral)
    elif use_window and "sliding_attention" in kinds:
        local_window = positive("sliding_window")                                 # local and global layers
    encoder = config.get("model_type") in ENCODER_TYPES
    name = str(config.get("_name_or_path") or config.get("model_type") or path.parent.name or path.stem)
    unknown = [k for k in config if _ATTENTION_FIELD.search(k) and k not in UNDERSTOOD | OUTSIDE_THE_KERNEL
               and not (k == "query_pre_attn_scalar" and config[k] == head_dim)]  # 1/sqrt(head_dim): the default
    if isinstance(config.get("rope_scaling"), dict) and config["rope_scaling"].get("mscale_all_dim"):
        # DeepSeek's yarn multiplies the softmax scale by mscale^2; the shape keeps 1/sqrt(head_dim)
        unknown.append("rope_scaling.mscale_all_dim (softmax scale)")
    if unknown:
        warnings.warn(f"{path}: attention fields not understood, not modelled: {', '.join(sorted(unknown))}",
                      stacklevel=2)
    try:
        return ModelShape(name, heads, kv_heads, head_dim, "none" if encoder else mask, source=str(path),
                          encoder=encoder, softcap=float(softcap) if softcap else None,
                          sinks=config.get("model_type") in SINK_MODELS, head_dim_v=head_dim_v,
                          local_window=None if encoder else local_window, not_understood=tuple(sorted(unknown)))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def quick_cases(preset: str | None, hf_config: str | Path | None, *, batch: int | None = None,
                seq: int | None = None) -> list[AttentionCase] | None:
    """`check`'s cases for --preset/--hf-config (ModelShape.quick_cases), or None when neither is given."""
    shape = model_shape(preset, hf_config)
    if shape is None and (batch is not None or seq is not None):
        raise ValueError("--batch and --seq size the cases of a --preset or --hf-config; give one of those")
    return None if shape is None else shape.quick_cases(batch, seq)


def model_shape(preset: str | None, hf_config: str | Path | None) -> ModelShape | None:
    """The shape `--preset` or `--hf-config` names (not both), or None."""
    if preset and hf_config:
        raise ValueError("give --preset or --hf-config, not both")
    return get_preset(preset) if preset else (from_hf_config(hf_config) if hf_config else None)


CASE_SOURCES.append(lambda: [c for shape in PRESETS.values() for dtype in ("bf16", "fp16")
                             for c in shape.cases(dtype) + shape.quick_cases()])
