"""The results schema, defined once: the `Row` type (its fields are the CSV columns), key, statuses and phases."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, make_dataclass
from typing import Iterable, NamedTuple

#: 2: timing_status and timing_reason added (a timing failure no longer overwrites the correctness status);
#: baseline (how the naive baseline was computed). 3: attention modifiers - head_dim_v, modifiers, modifier_path and
#: the dsinks/dbias error, tolerance and naive columns (older files load with them empty). 4: fp8_kv and quant_err
#: (FP8 KV caches). 5: fp8_q (FP8 queries too; older files load with it empty). 6: repro (a failing row's command).
#: 7: contention (the CPU other processes took while the key was timed)
SCHEMA_VERSION = 7

#: a result is one (case, backend, phase)
KEY = ("case_id", "backend", "phase")

# The vocabulary is spelled here once; code everywhere else uses these names (tests/unit/test_architecture.py
# fails on a phase or status written as a literal outside this module).
#: the statuses a row can have: judged against the reference (pass/fail); raised or died (error); out of memory
#: (oom); the backend cannot take this case (unsupported) or cannot run here at all (unavailable); a semantics
#: answer, recorded rather than judged (observed)
PASS, FAIL, ERROR, OOM = "pass", "fail", "error", "oom"
UNSUPPORTED, UNAVAILABLE, OBSERVED = "unsupported", "unavailable", "observed"
STATUSES = (PASS, FAIL, UNSUPPORTED, UNAVAILABLE, ERROR, OOM, OBSERVED)
#: worst first: the status of a (case, backend) made of several phase rows is the first one present
STATUS_ORDER = (ERROR, OOM, FAIL, PASS, UNSUPPORTED, UNAVAILABLE, OBSERVED)
#: the backend ran and got it wrong, or died trying
BAD = (FAIL, ERROR, OOM)
#: what fails a check or a test: a wrong answer or a raise (out of memory is the device's limit: a skip)
FAILING = (FAIL, ERROR)
#: the backend ran the case and its answer was judged (the rows that name the kernel that ran)
JUDGED = (PASS, FAIL)
#: the backend did not run the case, with a reason
NOT_RUN = (UNSUPPORTED, UNAVAILABLE)
#: fwd = inference call; bwd = the backward alone; fwd+bwd = one training step (timing only)
FWD, BWD, FWD_BWD = "fwd", "bwd", "fwd+bwd"
PHASES = (FWD, BWD, FWD_BWD)
#: phases that carry a correctness verdict
VERDICT_PHASES = (FWD, BWD)
#: how the benchmark stage ended for a key, apart from its correctness: timed; not-timed (its correctness did not
#: pass); rejected (it was timed, but the timed calls failed an integrity check - their output or gradients were
#: wrong, an input was written, or the figure is beyond the physical limit - so its figures are never used; the
#: reason says which); unsupported, error or oom while timing
TIMED, NOT_TIMED, REJECTED = "timed", "not-timed", "rejected"
TIMING_STATUSES = (TIMED, NOT_TIMED, REJECTED, UNSUPPORTED, ERROR, OOM)
#: the backend every other is compared with: the reference's same-precision baseline, and the speedups' base
BASELINE = "naive"
#: the columns that are a timing's figures
FIGURE_COLUMNS = ("latency_ms", "latency_iqr_ms", "latency_min_ms", "n_samples", "rounds", "round_spread", "noisy",
                  "tflops", "pct_of_peak", "gbps", "pct_of_bw_peak")


def figures_usable(timing_status: object) -> bool:
    """Whether a row's (or a key's samples') figures may be used: not when its timing was rejected, not even an
    earlier round's. Every reader of results and samples goes through store.load (usable_figures), so no speedup,
    summary, figure, gate or recommendation sees them."""
    return timing_status != REJECTED


#: a key's figure is loaded when other processes took more than this share of the machine's CPUs while it was timed
#: (Row.contention): the run's summary counts them, history marks them and change points leave them out by default
LOADED_SHARE = 0.5


def loaded(contention: object) -> bool:
    """Whether a row's figures were taken beside other load (its contention over LOADED_SHARE; unknown: no)."""
    try:
        return float(contention) > LOADED_SHARE
    except (TypeError, ValueError):
        return False


def figures_comparable(timing_status: object, suspicious: object) -> bool:
    """Whether a row's figures may enter a comparison between backends - a speedup, a winner, a ranking, a
    recommendation: usable, and not beyond the measured peak (`suspicious`, measure/limits/bandwidth.py). A figure the
    machine cannot reach is no speedup: it is shown, flagged, and compared once a quiet re-measurement clears it."""
    return figures_usable(timing_status) and suspicious is not True and suspicious != "True"


#: what limits a timed row (its `bound` column): the matmul peak or the memory bandwidth
BOUNDS = ("compute", "memory")
#: the columns whose values are the vocabulary above (a row's phase is never empty; the others may be)
ALLOWED = {"status": STATUSES, "timing_status": TIMING_STATUSES, "bound": BOUNDS, "phase": PHASES}


class Quantity(NamedTuple):
    """A quantity judged against the reference: `name` (the row's <name>_err, <name>_tol and naive_<name>_err
    columns), the input it is the gradient of (None: the output) and its tolerance factor: tol = factor x naive's
    error + the dtype's floor x magnitude (oracle/verdict.py)."""

    name: str
    of: str | None
    factor: float


#: every quantity judged, in the columns' order; dsinks and dbias only where the case has sinks or a bias (the
#: modifiers' inputs, cases/modifiers.MODIFIER_GRADS): sums of dS like dk, so they get dk's factor
JUDGED_QUANTITIES = (Quantity("out", None, 2.0), Quantity("dq", "q", 4.0), Quantity("dk", "k", 4.0),
                     Quantity("dv", "v", 4.0), Quantity("dsinks", "sinks", 4.0), Quantity("dbias", "bias", 4.0))
QUANTITIES = tuple(q.name for q in JUDGED_QUANTITIES)
#: input -> its gradient's quantity (the leaves a backward differentiates)
GRADIENT_OF = {q.of: q.name for q in JUDGED_QUANTITIES if q.of is not None}
#: the gradients of q, k, v, judged in every backward
GRADS = tuple(GRADIENT_OF[x] for x in ("q", "k", "v"))

# The gate's and the advisor's words (compare/, measure/stats.py, advisor/), spelled here once like the statuses.
#: the gate's timing verdict on a key between two runs: a change established beyond the margin (slower, faster),
#: none beyond it (unchanged), or too noisy to tell (undecided); not-timed where either side has no timing;
#: rejected (the timing status's word) where a re-measured round failed an integrity check: no figure, a failed gate
SLOWER, FASTER, UNCHANGED, UNDECIDED = "slower", "faster", "unchanged", "undecided"
TIMING_VERDICTS = (SLOWER, FASTER, UNCHANGED, UNDECIDED, NOT_TIMED, REJECTED)
#: a key in only one of the two runs
MISSING, NEW_ONLY = "missing", "new-only"
COMPARE_VERDICTS = (*TIMING_VERDICTS, MISSING, NEW_ONLY)
#: how a key's correctness changed from the base run to the new one: the same, worse (a bad status or a larger
#: error), lost (it passed and now does not run), better (now passes)
SAME, WORSE, LOST, BETTER = "same", "worse", "lost", "better"
#: the advisor's word for two backends the gate's statistic cannot separate (unchanged), and for a difference it left
#: undecided: too noisy (p >= alpha), or significant by the samples' rank test but not confirmed (by their rounds)
TIED, TIED_NOISY, TIED_UNCONFIRMED = "tied", "tied (too noisy to tell)", "tied (differs, not confirmed)"


def worst_status(statuses: Iterable[str]) -> str:
    """The status that sums up several rows: error/oom/fail beat pass; unsupported alone stays unsupported."""
    present = set(statuses)
    for status in STATUS_ORDER:
        if status in present:
            return status
    raise ValueError(f"no known status among {sorted(present)}; allowed: {', '.join(STATUSES)}")


class TimingKey(NamedTuple):
    """What a timing is about: one (case, backend, phase)."""

    case_id: str
    backend: str
    phase: str


@dataclass(frozen=True)
class _RowCase:
    """The columns before the judged quantities' (Row's docstring)."""

    run_id: str
    case_id: str
    backend: str
    phase: str
    # the case
    batch: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    seq_q: int | None = None
    seq_k: int | None = None
    head_dim: int | None = None
    head_dim_v: int | None = None
    dtype: str | None = None
    mask: str | None = None
    #: the case's modifiers as case-id tokens ('cap30-sink', 'none'): harness.cases.modifiers
    modifiers: str | None = None
    #: keys per page of a paged KV cache (empty: contiguous K/V)
    page_size: int | None = None
    #: an FP8 KV cache's scale granularity, 'tensor' or 'head' (harness.cases.fp8; empty: K/V in the case's dtype)
    fp8_kv: str | None = None
    #: True: q float8 e4m3 too, scaled with fp8_kv's granularity (harness.cases.fp8; empty: q in the case's dtype)
    fp8_q: bool | None = None
    scale: float | None = None
    device: str | None = None
    # correctness
    status: str | None = None
    reason: str | None = None


#: every judged quantity's error and tolerance, then naive's error: out_err, out_tol, ..., naive_dbias_err
_RowJudged = make_dataclass("_RowJudged", [(column, "float | None", None) for column in (
    *(f"{q}_{what}" for q in QUANTITIES for what in ("err", "tol")), *(f"naive_{q}_err" for q in QUANTITIES))],
    bases=(_RowCase,), frozen=True)
_RowJudged.__module__ = __name__


@dataclass(frozen=True)
class Row(_RowJudged):
    """One line of results.csv. Empty (None) fields are written as empty cells; a later row with the same key
    fills in more columns (the benchmark stage after correctness), and loading folds them into one. The columns:
    the key and the case (_RowCase), each judged quantity's (JUDGED_QUANTITIES), then these."""

    #: FP8 KV cases: the quantization's own error, max|ref(dequantized K/V) - ref(unquantized K/V)| of the output (and
    #: of q's quantization where fp8_q) (both float64 references; the same for every backend), beside out_err, which
    #: judges the kernel alone
    quant_err: float | None = None
    #: how the naive baseline of the tolerance was computed: dense, chunked (rows a chunk), or the fixed bound
    baseline: str | None = None
    err_ratio: float | None = None
    nonfinite: bool | None = None
    backend_op: str | None = None
    #: how the case's modifiers reached the kernel ('score_mod', 'attn_mask float', 'native softcap', ...)
    modifier_path: str | None = None
    observed: str | None = None
    #: a failing (fail, error) row's one-line command that reruns its case with its inputs (harness.run.repro)
    repro: str | None = None
    # performance (filled by the benchmark stage)
    timing_status: str | None = None
    timing_reason: str | None = None
    latency_ms: float | None = None
    latency_iqr_ms: float | None = None
    latency_min_ms: float | None = None
    n_samples: int | None = None
    rounds: int | None = None
    round_spread: float | None = None
    timing_mode: str | None = None
    threads: int | None = None
    #: the most, over the key's rounds, of the machine's CPU time that processes other than the timed worker and the
    #: run took while it was timed, as a share of all CPUs (0-1; isolation/neighbours.py): the load it ran beside
    contention: float | None = None
    noisy: bool | None = None
    peak_mem_bytes: int | None = None
    mem_method: str | None = None
    flops: int | None = None
    tflops: float | None = None
    pct_of_peak: float | None = None
    suspicious: bool | None = None
    compile_ms: float | None = None
    #: the bandwidth roofline (measure.bandwidth): least bytes a call moves, GB/s, % of the measured copy bandwidth,
    #: and 'compute' or 'memory' from the arithmetic intensity against the ridge point
    bytes_moved: int | None = None
    gbps: float | None = None
    pct_of_bw_peak: float | None = None
    bound: str | None = None
    # provenance
    device_name: str | None = None
    testbed_id: str | None = None
    torch_version: str | None = None
    backend_version: str | None = None
    git_sha: str | None = None
    timestamp: str | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        for column, allowed in ALLOWED.items():
            value = getattr(self, column)
            if (value is not None or column == "phase") and value not in allowed:
                raise ValueError(f"{column}={value!r}; allowed: {', '.join(allowed)}")

    @property
    def key(self) -> TimingKey:
        return TimingKey(self.case_id, self.backend, self.phase)

    def as_dict(self) -> dict:
        return asdict(self)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Row))

#: raw timing samples, long format, one line per repetition: results/<run_id>/samples.csv. `round`: the
#: measurement round (rounds of one key are spread over the run, so they see its changing conditions)
SAMPLE_COLUMNS: tuple[str, ...] = ("run_id", "case_id", "backend", "phase", "round", "sample", "latency_ms")
