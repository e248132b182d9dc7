"""Model presets: a model's attention shape (heads, kv heads, head dim, mask), from the table below or a local
transformers config.json, and the cases a suite or the advisor builds from it."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from harness.spec.case import AttentionCase, paged_case, parse_dtype
from harness.spec.masks import MaskSpec, SlidingWindow, parse_mask
from harness.spec.matrices import decode_batch
from harness.spec.serving_step import StepMix, serving_step


#: `check --preset`'s small cases: the model's heads, kv heads, head dim and mask at a size the float64 reference
#: and the baseline do in about a second on 2 CPU cores (32 heads x 128 keys x d128)
QUICK_BATCH, QUICK_SEQ = 2, 128


def check_window(mask: MaskSpec | None, seq: int) -> MaskSpec | None:
    """The model's mask at a check's length `seq`: a sliding window of more than seq // 2 keys back, which would
    cut few rows or none (Mistral's 4096 at 128 tokens is plain causal there, so a window off-by-one passed
    `check --preset mistral-7b`, issue 34), becomes seq // 4 keys back (32 at 128 tokens, the size the matrices'
    'window' mask has), labelled scaled_from the model's window in the case id; anything else is kept."""
    if isinstance(mask, SlidingWindow) and (mask.left < 0 or mask.left > seq // 2):
        return SlidingWindow(max(1, seq // 4), mask.right, scaled_from=mask.left if mask.left > 0 else None)
    return mask


@dataclass(frozen=True)
class ModelShape:
    """One model's attention: `mask` is a parse_mask name (causal for decoders, windowN for sliding windows,
    none for encoders); `source` says where the numbers come from. softcap, sinks and head_dim_v are the case
    spec's modifiers; `local_window` N means the model alternates local layers (windowN) with global ones (`mask`),
    and its cases run both layer kinds."""

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
        """The mask of each layer kind: (mask,), or (windowN, mask) for alternating local/global layers."""
        return (self.mask,) if self.local_window is None else (f"window{self.local_window}", self.mask)

    def mask_for(self, seq_q: int, seq_k: int, layer_mask: str | None = None) -> str:
        """The mask name at these lengths (of one layer kind, default the global one): a causal decoder's queries
        sit at the end of its keys (bottom-right alignment) when there are fewer of them, as in decode and chunked
        prefill."""
        mask = self.mask if layer_mask is None else layer_mask
        return "causal-br" if mask == "causal" and seq_q != seq_k else mask

    def case(self, batch: int, seq: int, dtype: str = "bf16", *, seq_q: int | None = None,
             layer_mask: str | None = None) -> AttentionCase:
        """The model's attention at (batch, seq) in `dtype`, of one layer kind (default the global one); seq_q=1 for
        one decode step over `seq` cached keys."""
        seq_q = seq if seq_q is None else seq_q
        mask = self.mask_for(seq_q, seq, layer_mask)
        return AttentionCase(batch, self.heads, seq_q, self.head_dim, parse_dtype(dtype), kv_heads=self.kv_heads,
                             seq_k=seq, mask=parse_mask(mask, batch=batch, seq_k=seq, seq_q=seq_q),
                             softcap=self.softcap, sinks=self.sinks, head_dim_v=self.head_dim_v)

    def quick_cases(self, batch: int | None = None, seq: int | None = None) -> list[AttentionCase]:
        """Small cases of this model's attention, for a quick check of a kernel on its shape (QUICK_BATCH x
        QUICK_SEQ unless given), for every layer kind: prefill in fp32 and bf16 and, for a decoder, one decode
        step over `seq` keys. A window longer than the check's length allows is scaled to it (check_window)."""
        batch, seq = batch or QUICK_BATCH, seq or QUICK_SEQ
        out = []
        for layer in self.layer_masks:
            cases = [self.case(batch, seq, "fp32", layer_mask=layer), self.case(batch, seq, "bf16", layer_mask=layer)]
            if not self.encoder:
                cases.append(self.case(batch, seq, "bf16", seq_q=1, layer_mask=layer))
            out += [replace(c, mask=check_window(c.mask, seq)) for c in cases]
        return out

    def cases(self, dtype: str = "bf16", tokens: int = 16384) -> list[AttentionCase]:
        """A suite's cases for this model, for every layer kind: prefill/training at `tokens` tokens a batch over its
        usual sequence lengths, decode steps over long caches (decoders), and bf16 plus fp16 at one length."""
        if self.encoder:
            seqs = (197, 577, 1025)  # ViT-L/16 at 224 px, ViT-L/14 at 336 px, a 448 px /14 grid: patches + CLS
        else:
            seqs = (1024, 2048, 4096, 8192, 16384)
        out = []
        for layer in self.layer_masks:
            out += [self.case(max(1, tokens // s), s, dtype, layer_mask=layer) for s in seqs]
            out.append(self.case(max(1, tokens // seqs[1]), seqs[1], "fp16" if dtype != "fp16" else "bf16",
                                 layer_mask=layer))
            if not self.encoder:
                out += [self.case(decode_batch(n), n, dtype, seq_q=1, layer_mask=layer) for n in (4096, 32768, 131072)]
        # paged serving steps: CacheCausal is plain causal (a window would be lost), and paged cases take no
        # modifiers yet (spec.paged.validate_paged_case)
        plain = self.softcap is None and not self.sinks and self.head_dim_v in (None, self.head_dim)
        if not self.encoder and self.mask == "causal" and self.local_window is None and plain:
            out += [self.paged_case(decode_batch(32768), 32768, q, p, dtype) for q in (1, 4, 8) for p in (16, 256)]
            out.append(self.serving_step(32768, 16, dtype))
        return list(dict.fromkeys(out))

    def paged_case(self, batch: int, cache: int, seq_q: int, page_size: int, dtype: str = "bf16") -> AttentionCase:
        """A decode (seq_q=1) or speculative-decoding verification step over paged caches of about `cache` keys."""
        return paged_case(batch, self.heads, seq_q, self.head_dim, parse_dtype(dtype), kv_heads=self.kv_heads,
                          cache=cache, page_size=page_size)

    def serving_step(self, cache: int, page_size: int | None, dtype: str = "bf16", mix: StepMix = StepMix()) -> AttentionCase:
        """A mixed serving step (spec.serving_step: by default one 512-token prefill chunk, 31 decodes, 4
        verifications of 4 tokens) over caches of about `cache` keys."""
        return serving_step(self.heads, self.head_dim, parse_dtype(dtype), kv_heads=self.kv_heads, cache=cache,
                            page_size=page_size, mix=mix)


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


def _positive_int(config: dict, key: str, path: Path) -> int:
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{path}: {key}={value!r}: must be an integer >= 1")
    return value


#: config fields the reader understands (they set the shape), and attention-looking ones that do not concern the
#: kernel: q/k/v/o projection biases, positions applied to q/k before it, MLA's compressed projections, the LM
#: head's own softcap, dropout (a training feature the shape does not carry)
UNDERSTOOD = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "sliding_window",
                        "use_sliding_window", "layer_types", "sliding_window_pattern", "attn_logit_softcapping",
                        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "sliding_window_size"})
OUTSIDE_THE_KERNEL = frozenset({"attention_bias", "attention_dropout", "rope_theta", "rope_scaling", "rope_interleave",
                                "partial_rotary_factor", "final_logit_softcapping", "kv_lora_rank", "q_lora_rank",
                                "max_window_layers", "rope_local_base_freq", "head_dim_original"})
_ATTENTION_FIELD = re.compile(r"attn|attention|window|softcap|head_dim|sink|alibi|rope|lora|scalar|bias")
#: transformers' gpt-oss attention always has one learned sink per head (GptOssAttention.sinks)
SINK_MODELS = ("gpt_oss",)


def _layer_kinds(config: dict) -> set[str] | None:
    """The kinds in layer_types, or the alternation transformers derives when a config has none: Gemma 2 every
    other layer local (Gemma2Config), a sliding_window_pattern P every P-th layer global (Gemma3Config)."""
    if isinstance(config.get("layer_types"), list):
        return set(config["layer_types"])
    if config.get("sliding_window_pattern"):
        return {"sliding_attention", "full_attention"} if int(config["sliding_window_pattern"]) > 1 else None
    if config.get("model_type") == "gemma2":
        return {"sliding_attention", "full_attention"}
    return None


def from_hf_config(path: str | Path) -> ModelShape:
    """A model's attention shape from a local transformers config.json: num_attention_heads,
    num_key_value_heads (default: the same), head_dim (default: hidden_size // heads; MLA: qk_nope_head_dim +
    qk_rope_head_dim, with v_head_dim), attn_logit_softcapping, sliding_window (when set and not switched off by
    use_sliding_window: false) with layer_types (sliding and full layers: both kinds run), sinks for gpt-oss.
    Attention fields it does not model are listed in `not_understood` and warned about, not guessed. Read from
    disk only; nothing is downloaded."""
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
    head_dim_v = None
    if config.get("qk_nope_head_dim") is not None and config.get("qk_rope_head_dim") is not None:  # MLA
        head_dim = _positive_int(config, "qk_nope_head_dim", path) + _positive_int(config, "qk_rope_head_dim", path)
        head_dim_v = _positive_int(config, "v_head_dim", path) if config.get("v_head_dim") is not None else None
    elif config.get("head_dim") is not None:  # a head_dim of 0 is refused, not replaced by hidden_size // heads
        head_dim = _positive_int(config, "head_dim", path)
    elif "hidden_size" in config:
        hidden = _positive_int(config, "hidden_size", path)
        if hidden % heads:
            raise ValueError(f"{path}: hidden_size={hidden} is not a multiple of num_attention_heads={heads}; "
                             "give head_dim")
        head_dim = hidden // heads
    else:
        raise ValueError(f"{path}: needs head_dim, or hidden_size to derive it")
    softcap = config.get("attn_logit_softcapping") or None
    window = config.get("sliding_window")
    use_window = bool(window) and config.get("use_sliding_window", True) is not False
    kinds = _layer_kinds(config) if use_window else None
    local_window = None
    mask = "causal"
    if use_window and (kinds is None or kinds == {"sliding_attention"}):
        mask = f"window{_positive_int(config, 'sliding_window', path)}"          # every layer local (Mistral)
    elif use_window and "sliding_attention" in kinds:
        local_window = _positive_int(config, "sliding_window", path)              # local and global layers
    # bidirectional encoders: no causal mask, no decode
    encoder = config.get("model_type") in ("vit", "bert", "roberta", "clip_vision_model", "dinov2", "siglip_vision_model")
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

