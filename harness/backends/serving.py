"""A backend in the serving stack's terms: which setting of vLLM, SGLang or transformers runs its kernels, since (and
until) which version, read from those projects' released sources (docs/frameworks.md has the readings)."""

from __future__ import annotations

from dataclasses import dataclass

#: the frameworks whose settings a backend may declare, as `recommend --for` names them
FRAMEWORKS = ("vllm", "sglang", "transformers")


def _release(version: str) -> tuple:
    """'0.4.9.post5' -> (0, 4, 9, 0.5): comparable releases (a post release just after its base)."""
    parts = []
    for piece in version.split("."):
        if piece.startswith("post"):
            parts[-1] += float(piece[4:] or 0) / 10 + 0.05
        elif piece.isdigit():
            parts.append(int(piece))
        else:
            raise ValueError(f"version {version!r}: expected dotted numbers (and .postN), e.g. 0.13.0")
    return tuple(parts)


@dataclass(frozen=True)
class ServingKnob:
    """How `framework` runs the backend's kernels: its attention setting `value`, from release `since` (until
    `until`, the last release that has it; None: still there at the version read), `also`: any further flags the
    value needs (e.g. vLLM's FlashAttention version), `note`: what differs from the harness's call of them."""

    framework: str
    value: str
    since: str
    until: str | None = None
    also: tuple[str, ...] = ()
    note: str = ""
    #: which phases the value serves where a framework chooses per phase (SGLang's fa4: prefill only before 0.5.8)
    decode_since: str | None = None

    def __post_init__(self):
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"ServingKnob.framework={self.framework!r}; allowed: {', '.join(FRAMEWORKS)}")
        if not self.value:
            raise ValueError(f"ServingKnob({self.framework!r}): needs the setting's value")
        for version in filter(None, (self.since, self.until, self.decode_since)):
            _release(version)

    def exists_in(self, version: str) -> bool:
        """Whether release `version` of the framework has this value."""
        v = _release(version)
        return _release(self.since) <= v and (self.until is None or v <= _release(self.until))

    @property
    def versions(self) -> str:
        return f"{self.since}-{self.until}" if self.until else f">= {self.since}"

    def settings(self, phase: str = "both") -> list[str]:
        """What to paste, newest form first, each with the releases it works in: phase 'prefill' or 'decode' gives
        SGLang's per-phase flags."""
        extra = "".join(f" {flag}" for flag in self.also)
        if self.framework == "vllm":
            lines = []
            if self.until is None or _release(self.until) >= _release("0.13.0"):
                lines.append(f"vllm serve MODEL --attention-backend {self.value}{extra}   "
                             f"# vLLM >= {max(self.since, '0.13.0', key=_release)}"
                             + (f", <= {self.until}" if self.until else ""))
            if _release(self.since) <= _release("0.14.1"):
                env = " ".join(f"{flag.split('=')[0].lstrip('-').replace('attention-config.', 'VLLM_').upper()}="
                               f"{flag.split('=')[1]}" for flag in self.also if "=" in flag)
                lines.append(f"VLLM_ATTENTION_BACKEND={self.value}{' ' + env if env else ''} vllm serve MODEL   "
                             f"# vLLM {self.since}-{min(self.until or '0.14.1', '0.14.1', key=_release)} "
                             "(the variable is ignored from 0.15.0)")
            return lines
        if self.framework == "sglang":
            if phase == "both":
                return [f"python -m sglang.launch_server --model-path MODEL --attention-backend {self.value}{extra}"
                        f"   # SGLang {self.versions}"]
            since = max(self.since, "0.4.9.post5", key=_release)
            if phase == "decode" and self.decode_since:
                since = max(since, self.decode_since, key=_release)
            return [f"--{phase}-attention-backend {self.value}   # SGLang >= {since}"]
        return [f'AutoModelForCausalLM.from_pretrained(MODEL, attn_implementation="{self.value}")   '
                f"# transformers {self.versions}"]

