"""A deployment workload: the attention shape(s) to advise on, from flags or a TOML/YAML file."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from harness.cases.case import AttentionCase, paged_case
from harness.cases.masks import MASK_NAMES, parse_mask
from harness.cases.presets import ModelShape, get_preset
from harness.cases.serving_step import StepMix, parse_mix, serving_step
from harness.store.schema import FWD, FWD_BWD

#: the parts of serving a workload may be (Workload.part): picked separately where a framework allows it
ROLES = ("prefill", "decode", "mixed", "training")


@dataclass(frozen=True)
class Workload:
    """One shape to advise on: q (batch, heads, seq_q, head_dim), k/v (batch, kv_heads, seq_k, head_dim); `mask` is
    a parse_mask name; softcap, sinks, alibi, bias and head_dim_v are the case spec's modifiers."""
    batch: int
    heads: int
    seq_q: int
    head_dim: int
    kv_heads: int | None = None
    seq_k: int | None = None
    dtype: str = "bf16"
    mask: str = "causal"
    training: bool = False
    name: str = ""
    softcap: float | None = None
    sinks: bool = False
    alibi: bool = False
    bias: str | None = None
    head_dim_v: int | None = None
    #: a paged KV cache of pages this size (a decode or verification step over caches of about seq_k keys)
    page_size: int | None = None
    #: a mixed serving step's mix id (e.g. 'p1x512-d31-v4x4'): batch and seq_q are then the mix's
    serving_step: str | None = None
    #: the traffic mix (advisor/mix.py): this shape's share of the calls (any positive number, relative to the
    #: others'), or the tokens per second it serves (its calls per second: tokens / (batch x seq_q)); one of the two
    weight: float | None = None
    tokens_per_s: float | None = None
    #: which part of serving it is (ROLES; None: read off the shape - see `role`)
    part: str | None = None

    def __post_init__(self):
        if not isinstance(self.training, bool):
            raise ValueError(f"training={self.training!r}: must be true or false")
        for key in ("weight", "tokens_per_s"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < float("inf")):
                raise ValueError(f"{key}={value!r}: must be a positive number")
        if self.weight is not None and self.tokens_per_s is not None:
            raise ValueError(f"weight={self.weight!r} and tokens_per_s={self.tokens_per_s!r}: give one of the two")
        if self.part is not None and self.part not in ROLES:
            raise ValueError(f"part={self.part!r}; allowed: {', '.join(ROLES)}")
        self.case()  # every other check (ints, dtype, mask, heads % kv_heads) is the case spec's own

    @property
    def role(self) -> str:
        """prefill, decode (a step over a longer cache: decode or a verification), mixed (a serving step of both) or
        training; `part` when given."""
        if self.part is not None:
            return self.part
        if self.training:
            return "training"
        if self.serving_step is not None:
            return "mixed"
        case = self.case()
        return "decode" if case.seq_q < case.seq_k else "prefill"

    @property
    def calls_weight(self) -> float:
        """Its calls per unit of traffic: `weight`, or tokens_per_s / tokens a call (batch x seq_q); 1 unweighted."""
        if self.tokens_per_s is not None:
            return self.tokens_per_s / (self.batch * self.seq_q)
        return 1.0 if self.weight is None else float(self.weight)

    def case(self) -> AttentionCase:
        modifiers = dict(softcap=self.softcap, sinks=self.sinks, alibi=self.alibi, bias=self.bias,
                         head_dim_v=self.head_dim_v)
        if self.serving_step is not None:
            mix = parse_mix(self.serving_step)
            if (self.batch, self.seq_q) != (mix.batch, max(mix.q_lens)):
                raise ValueError(f"serving step {mix.id}: batch={self.batch}, seq_q={self.seq_q} must be the mix's "
                                 f"{mix.batch} sequences and longest run {max(mix.q_lens)}")
            if any(v not in (None, False) for v in modifiers.values()):
                raise ValueError(f"serving step {mix.id}: takes no modifiers yet; got {modifiers}")
            return serving_step(self.heads, self.head_dim, self.dtype, kv_heads=self.kv_heads or self.heads,
                                cache=self.seq_k or self.seq_q, page_size=self.page_size, mix=mix)
        if self.page_size is not None:  # the spec refuses what a paged case cannot take (spec.paged)
            return paged_case(self.batch, self.heads, self.seq_q, self.head_dim, self.dtype,
                              kv_heads=self.kv_heads or self.heads, cache=self.seq_k or self.seq_q,
                              page_size=self.page_size, **modifiers)
        shape = AttentionCase(self.batch, self.heads, self.seq_q, self.head_dim, self.dtype, kv_heads=self.kv_heads,
                              seq_k=self.seq_k, **modifiers)
        if not isinstance(self.mask, str):
            raise ValueError(f"unknown mask {self.mask!r}; allowed: {', '.join(MASK_NAMES)}, or windowN")
        return replace(shape, mask=parse_mask(self.mask, batch=shape.batch, seq_k=shape.seq_k, seq_q=shape.seq_q))

    @property
    def phase(self) -> str:
        return FWD_BWD if self.training else FWD

    @property
    def label(self) -> str:
        return self.name or self.case().id


def model_workloads(model: ModelShape, batch: int, seq: int, *, seq_k: int | None = None, dtype: str = "bf16",
                    training: bool = False, seq_q: int | None = None, page_size: int | None = None,
                    step: str = "", serving_step: str | None = None, name: str = "") -> list[Workload]:
    """A model's workloads at (batch, seq): one per layer kind (Gemma 2's local and global layers), with the model's
    modifiers. A serving step (`seq_q` queries over `seq` cached keys, `page_size`, named by `step`) or a mixed
    `serving_step` (a mix id: batch and queries are the mix's, `seq` the longest cache) keeps the layer kinds.
    `name`, when given, stands for the model, batch (or mix) and seq in each workload's name."""
    if (page_size is not None or serving_step is not None) and model.mask != "causal":
        raise ValueError(f"{model.name}'s mask is {model.mask}; paged workloads and serving steps are causal decoders")
    out = []
    for layer in model.layer_masks:
        case = model.case(batch, seq_k or seq, dtype, seq_q=seq_q or seq, layer_mask=layer)
        kind = f" {layer} layers" if len(model.layer_masks) > 1 else ""
        if serving_step is not None:
            mix = parse_mix(serving_step)
            out.append(Workload(mix.batch, model.heads, max(mix.q_lens), model.head_dim, kv_heads=model.kv_heads,
                                seq_k=seq_k or seq, dtype=dtype, page_size=page_size, serving_step=mix.id,
                                name=f"{name or f'{model.name} step {mix.id} s{seq}'}{step}{kind}"))
            continue
        out.append(Workload(case.batch, case.heads, case.seq_q, case.head_dim, kv_heads=case.kv_heads,
                            seq_k=case.seq_k, dtype=dtype, mask=model.mask_for(case.seq_q, case.seq_k, layer),
                            training=training, name=f"{name or f'{model.name} b{batch} s{seq}'}{step}{kind}",
                            softcap=case.softcap, sinks=case.sinks, head_dim_v=case.head_dim_v, page_size=page_size))
    return out


WORKLOAD_KEYS = ("name", "preset", "batch", "heads", "kv_heads", "seq", "seq_q", "seq_k", "head_dim", "dtype", "mask",
                 "training", "softcap", "sinks", "alibi", "bias", "head_dim_v", "page_size", "serving_step", "weight",
                 "tokens_per_s", "part")
#: the traffic mix's keys: a shape's own, passed on to each workload it makes
MIX_KEYS = ("weight", "tokens_per_s", "part")
#: what a serving step's mix sets, so its shape may not give them (a [defaults] value does not apply to it)
STEP_SETS = ("batch", "seq_q", "mask")
#: what a `preset` (cases/presets.py) sets, so a shape that names one may not give them too
PRESET_SETS = ("heads", "kv_heads", "head_dim", "mask", "softcap", "sinks", "alibi", "bias", "head_dim_v")
FILE_KEYS = ("defaults", "shape")


@contextmanager
def _at(spot: str):
    """A ValueError or TypeError inside, as one ValueError that names `spot` first."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{spot}: {exc}") from None


def _shape_keys(entry: object, where: str) -> dict:
    """A table's keys with '-' read as '_' and `seq` expanded to seq_q = seq_k."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a table of {', '.join(WORKLOAD_KEYS)}; got {entry!r}")
    out = {str(k).replace("-", "_"): v for k, v in entry.items()}
    unknown = sorted(set(out) - set(WORKLOAD_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"allowed: {', '.join(WORKLOAD_KEYS)}")
    if "seq" in out:
        if "seq_q" in out or "seq_k" in out:
            raise ValueError(f"{where}: give seq, or seq_q/seq_k, not both")
        out["seq_q"] = out["seq_k"] = out.pop("seq")
    return out


def workloads_from_mapping(data: object, where: str = "workload", *, training: bool | None = None) -> list[Workload]:
    """{defaults?: {...}, shape: [{...}, ...]} -> workloads; `training` is a default under the file's own."""
    if not isinstance(data, dict) or set(data) - set(FILE_KEYS):
        extra = sorted(set(data) - set(FILE_KEYS)) if isinstance(data, dict) else data
        raise ValueError(f"{where}: unexpected top level {extra!r}; allowed keys: {', '.join(FILE_KEYS)}")
    shapes = data.get("shape")
    if not isinstance(shapes, list) or not shapes:
        raise ValueError(f"{where}: needs a non-empty list 'shape' ([[shape]] tables in TOML); got {shapes!r}")
    defaults = {**({} if training is None else {"training": training}),
                **_shape_keys(data.get("defaults", {}), f"{where} [defaults]")}
    workloads = []
    for i, entry in enumerate(shapes, 1):
        spot = f"{where} shape {i}"
        own = _shape_keys(entry, spot)
        keys = {**defaults, **own}
        mix = {k: keys[k] for k in MIX_KEYS if k in keys}
        if keys.get("serving_step") not in (None, False):  # the keys the shape wrote (`seq` not yet read as seq_q)
            made = _step_workloads(keys, {str(k).replace("-", "_") for k in entry}, spot)
        elif "preset" in keys:
            made = _preset_workloads(keys, own, spot)
        else:
            made = None
        if made is not None:
            with _at(spot):
                workloads += [replace(w, **mix) for w in made]
        else:
            missing = [k for k in ("batch", "heads", "seq_q", "head_dim") if k not in keys]
            if missing:
                raise ValueError(f"{spot}: missing {', '.join(missing)} (seq may stand for seq_q and seq_k)")
            with _at(spot):
                workloads.append(Workload(**{k: keys[k] for k in keys if k not in ("name", "serving_step")},
                                          name=str(keys.get("name", ""))))
    labels = [w.label for w in workloads]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{where}: shape names must be unique; got {labels}")
    return workloads


def _preset(keys: dict, own: dict | set, spot: str) -> ModelShape:
    """The shape's preset, which sets heads, kv heads, head dim, mask and modifiers: the shape may not give them."""
    with _at(spot):
        model = get_preset(str(keys["preset"]))
    clash = [k for k in PRESET_SETS if k in own]
    if clash:
        raise ValueError(f"{spot}: preset {model.name} sets heads, kv heads, head dim, mask and modifiers; drop "
                         f"{', '.join(clash)}")
    return model


def _preset_workloads(keys: dict, own: dict, spot: str) -> list[Workload]:
    """A preset's shapes at the shape's batch, seq (or seq_q/seq_k), dtype, training and page_size."""
    model = _preset(keys, own, spot)
    missing = [k for k in ("batch", "seq_q") if k not in keys]
    if missing:
        raise ValueError(f"{spot}: preset {model.name} needs batch and seq (or seq_q/seq_k); missing "
                         f"{', '.join(missing).replace('seq_q', 'seq')}")
    with _at(spot):
        return model_workloads(model, keys["batch"], keys["seq_q"], seq_k=keys.get("seq_k"), seq_q=keys["seq_q"],
                               dtype=keys.get("dtype", "bf16"), training=keys.get("training", False),
                               page_size=keys.get("page_size"), name=str(keys.get("name", "")))


def _step_workloads(keys: dict, own: set[str], spot: str) -> list[Workload]:
    """A shape with `serving_step` (a mix id, or true for the default mix): the mix's batch and query lengths over
    caches of up to `seq` (or seq_k) keys, paged with `page_size`, of a preset or the shape's heads and head_dim."""
    value = keys["serving_step"]
    if value is True:
        mix = StepMix()
    elif isinstance(value, str):
        with _at(spot):
            mix = parse_mix(value)
    else:
        raise ValueError(f"{spot}: serving_step={value!r}: must be a mix id pPxC-dD-vVxS such as {StepMix().id!r}, "
                         "or true for that one")
    clash = [k for k in STEP_SETS if k in own]
    if clash:
        raise ValueError(f"{spot}: serving step {mix.id} sets the batch, the query lengths and the mask (the caches' "
                         f"causal); drop {', '.join(clash)} (seq or seq_k is the longest cache)")
    if keys.get("training"):
        raise ValueError(f"{spot}: serving step {mix.id} is forward only; got training={keys['training']!r}")
    cache = keys.get("seq_k")
    name = str(keys.get("name", ""))
    if "preset" in keys:
        if cache is None:
            raise ValueError(f"{spot}: serving step {mix.id} of preset {keys['preset']} needs seq (the longest cache)")
        model = _preset(keys, own, spot)
        with _at(spot):
            return model_workloads(model, mix.batch, cache, dtype=keys.get("dtype", "bf16"),
                                   page_size=keys.get("page_size"), serving_step=mix.id, name=name)
    missing = [k for k in ("heads", "head_dim", "seq_k") if k not in keys]
    if missing:
        raise ValueError(f"{spot}: serving step {mix.id} needs heads, head_dim and seq (the longest cache; or "
                         f"seq_k); missing {', '.join(missing).replace('seq_k', 'seq')}")
    given = {k: keys[k] for k in keys
             if k not in (*STEP_SETS, *MIX_KEYS, "name", "preset", "serving_step", "training", "seq_q")}
    with _at(spot):
        return [Workload(mix.batch, seq_q=max(mix.q_lens), serving_step=mix.id,
                         name=name or f"step {mix.id} s{cache}", **given)]


def load_workloads(path: str | Path, *, training: bool | None = None) -> list[Workload]:
    """Workloads from a .toml file (tomllib) or .yaml/.yml (PyYAML's safe_load, when installed)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"workload file {path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".toml":
        import tomllib
        parse, invalid, kind = tomllib.loads, tomllib.TOMLDecodeError, "TOML"
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"workload file {path}: reading YAML needs PyYAML (pip install pyyaml); "
                             "or write it as .toml") from None
        parse, invalid, kind = yaml.safe_load, yaml.YAMLError, "YAML"
    else:
        raise ValueError(f"workload file {path}: suffix {suffix!r}; allowed: .toml, .yaml, .yml")
    try:
        data = parse(path.read_text())
    except invalid as exc:
        raise ValueError(f"workload file {path}: not valid {kind}: {exc}") from None
    return workloads_from_mapping(data, str(path), training=training)
