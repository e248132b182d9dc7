"""Do two runs give the same rows? Keys, statuses, error figures and answers must agree; ids, timestamps and
timings may differ. Used to check that a refactoring changed no verdict:

    python scripts/same_rows.py results/<before> results/<after>      # exit 0 when the rows agree

Error figures (err, tol, naive err, err_ratio) are compared to a relative 1e-6: the float64 reference may round
differently after a change of its block size, which moves a backend's error by far less than that.
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd


from harness.store.load import load_results
from harness.store.schema import KEY, QUANTITIES

FIGURES = [f"{q}_{kind}" for q in QUANTITIES for kind in ("err", "tol")] + \
          [f"naive_{q}_err" for q in QUANTITIES] + ["err_ratio"]
EXACT = ["status", "nonfinite", "observed", "backend_op"]
REL_TOL = 1e-6


def _same_number(a, b) -> bool:
    a, b = pd.to_numeric(a, errors="coerce"), pd.to_numeric(b, errors="coerce")
    if pd.isna(a) and pd.isna(b):
        return True
    if pd.isna(a) or pd.isna(b):
        return False
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b), 1e-300)


def _text(value) -> str:
    return "" if pd.isna(value) else str(value)


def differences(before: pd.DataFrame, after: pd.DataFrame) -> dict[str, list[str]]:
    """{'missing'|'extra'|column: [what differs]} between two folded results frames."""
    b, a = before.set_index(list(KEY)), after.set_index(list(KEY))
    out: dict[str, list[str]] = {"missing": [str(k) for k in b.index.difference(a.index)],
                                 "extra": [str(k) for k in a.index.difference(b.index)]}
    common = b.index.intersection(a.index)
    for column in EXACT + FIGURES + ["reason"]:
        if column not in b.columns and column not in a.columns:
            continue
        left = b.reindex(common)[column] if column in b.columns else pd.Series(index=common, dtype=object)
        right = a.reindex(common)[column] if column in a.columns else pd.Series(index=common, dtype=object)
        for key in common:
            x, y = left[key], right[key]
            same = _same_number(x, y) if column in FIGURES else _text(x) == _text(y)
            if not same:
                out.setdefault(column, []).append(f"{key}: {_text(x)!r} -> {_text(y)!r}")
    return {k: v for k, v in out.items() if v}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--ignore", action="append", default=[],
                        help="a column whose differences are listed but do not fail (repeatable), e.g. reason")
    args = parser.parse_args(argv)
    before, after = load_results(args.before), load_results(args.after)
    diffs = differences(before, after)
    print(f"{len(before)} rows before, {len(after)} after")
    failing = False
    for column, items in diffs.items():
        ignored = column in args.ignore
        failing |= not ignored
        print(f"{column}: {len(items)} differ{' (ignored)' if ignored else ''}")
        for item in items[:20]:
            print(f"  {item}")
    if not diffs:
        print("same keys, statuses, error figures, answers and reasons")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
