"""ruptures' PELT with the l1 cost (Pelt(model="l1", jump=1)), compiled: the same breakpoints, float for float.

ruptures computes each segment's cost in Python (np.median, then the sum of absolute deviations): 6 s for one key of
375 runs. This is the same search, step for step - the same candidates in the same order, the same pruning (its
quirks included), each cost summed in numpy's pairwise order and each total added as ruptures adds it - so every
comparison sees the same floats and the breakpoints are ruptures' own (tests/unit/measure/test_pelt_l1.py checks it
against ruptures on random series). What is faster: each candidate segment keeps its values sorted as the segment
grows (its median is then one read), and the loops are compiled (numba).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: numpy's pairwise summation: blocks of up to 128 summed with 8 accumulators, larger ones split in two
_BLOCK = 128


@njit(cache=True)
def _block(a, lo, n):
    """numpy's pairwise sum of a block of at most 128 values: 8 accumulators, then the rest one by one."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - (n % 8):
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True)
def _pairwise(a, lo, n):
    """numpy's DOUBLE_pairwise_sum of a[lo:lo+n] (umath/loops_utils.h), operation for operation: a block of up to
    128 values as _block, a longer run split in two (the first part a multiple of 8) and the halves' sums added.
    The recursion is run on a stack of its own (numba cannot cache a recursive function)."""
    if n <= _BLOCK:
        return _block(a, lo, n)
    los, ns, state, left = np.empty(64, np.int64), np.empty(64, np.int64), np.empty(64, np.int64), np.empty(64)
    sp, ret = 0, 0.0
    los[0], ns[0], state[0] = lo, n, 0
    while sp >= 0:
        m = ns[sp]
        half = m // 2 - (m // 2) % 8
        if m <= _BLOCK:
            ret = _block(a, los[sp], m)
            sp -= 1
        elif state[sp] == 0:  # first the left part
            state[sp] = 1
            sp += 1
            los[sp], ns[sp], state[sp] = los[sp - 1], half, 0
        elif state[sp] == 1:  # the left part's sum is in ret: then the right part
            left[sp], state[sp] = ret, 2
            sp += 1
            los[sp], ns[sp], state[sp] = los[sp - 1] + half, m - half, 0
        else:
            ret = left[sp] + ret
            sp -= 1
    return ret


@njit(cache=True)
def _exact_cost(z, start, end, med, dev):
    """CostL1.error(start, end) of ruptures, float for float: sum |z - median| over z[start:end]."""
    k = end - start
    for i in range(k):
        dev[i] = abs(z[start + i] - med)
    return 0.0 + _pairwise(dev, 0, k)  # add.reduce: its initial value 0.0, then the pairwise sum


@njit(cache=True)
def _sift_up(heap, t, i, sign):
    """Restore row t of `heap` (a min-heap of sign * value) upward from i."""
    value = heap[t, i]
    while i > 0:
        parent = (i - 1) // 2
        if sign * heap[t, parent] <= sign * value:
            break
        heap[t, i] = heap[t, parent]
        i = parent
    heap[t, i] = value


@njit(cache=True)
def _pop(heap, t, size, sign):
    """Remove and return the top of row t of `heap`, `size` values (a min-heap of sign * value)."""
    top = heap[t, 0]
    size -= 1
    value = heap[t, size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and sign * heap[t, child + 1] < sign * heap[t, child]:
            child += 1
        if sign * value <= sign * heap[t, child]:
            break
        heap[t, i] = heap[t, child]
        i = child
    heap[t, i] = value
    return top


@njit(cache=True)
def _push(heap, t, size, value, sign):
    heap[t, size] = value
    _sift_up(heap, t, size, sign)


@njit(cache=True)
def _add(low, high, sizes, sums, t, x):
    """Add x to candidate t's segment: low[t] a max-heap of its lower half (the median too when the count is odd),
    high[t] a min-heap of its upper half; sizes[t] and sums[t] their counts and sums."""
    if sizes[t, 0] == 0 or x <= low[t, 0]:
        _push(low, t, sizes[t, 0], x, -1.0)
        sizes[t, 0] += 1
        sums[t, 0] += x
    else:
        _push(high, t, sizes[t, 1], x, 1.0)
        sizes[t, 1] += 1
        sums[t, 1] += x
    if sizes[t, 0] > sizes[t, 1] + 1:  # one from the lower half up
        y = _pop(low, t, sizes[t, 0], -1.0)
        sizes[t, 0] -= 1
        sums[t, 0] -= y
        _push(high, t, sizes[t, 1], y, 1.0)
        sizes[t, 1] += 1
        sums[t, 1] += y
    elif sizes[t, 1] > sizes[t, 0]:
        y = _pop(high, t, sizes[t, 1], 1.0)
        sizes[t, 1] -= 1
        sums[t, 1] -= y
        _push(low, t, sizes[t, 0], y, -1.0)
        sizes[t, 0] += 1
        sums[t, 0] += y


@njit(cache=True)
def _median(low, high, sizes, t):
    """np.median of candidate t's segment: the middle value, or the mean of the two middle ones."""
    if sizes[t, 0] > sizes[t, 1]:
        return low[t, 0]
    return (low[t, 0] + high[t, 0]) / 2.0


@njit(cache=True)
def pelt_l1_ends(z, pen, min_size):
    """Pelt(model="l1", min_size, jump=1).fit(z).predict(pen) of a 1-D float64 series: its segment ends, sorted.

    Each candidate's cost is first taken from its halves' sums (sum of the upper half - sum of the lower half, + the
    median for an odd count: the l1 cost, in O(1)), which differs from ruptures' float by far less than `slack`
    (a million times the rounding of ~n additions of values up to k * max|z|); a cost is summed as ruptures sums it
    wherever a decision (the least total, the pruning) could go either way within that slack, so every decision
    is ruptures' own."""
    n = z.shape[0]
    total = np.zeros(n + 1)  # ruptures' sum(partitions[t].values())
    has = np.zeros(n + 1, dtype=np.bool_)  # partitions[t] exists
    came_from = np.full(n + 1, -1, dtype=np.int64)
    has[0] = True
    admissible = np.empty(n + 1, dtype=np.int64)
    subs = np.empty(n + 1, dtype=np.int64)
    approx, exact, known = np.empty(n + 1), np.empty(n + 1), np.zeros(n + 1, dtype=np.bool_)
    dev = np.empty(n)
    half = n // 2 + 2
    low, high = np.empty((n + 1, half)), np.empty((n + 1, half))
    sizes, sums = np.zeros((n + 1, 2), dtype=np.int64), np.zeros((n + 1, 2))
    biggest = np.max(np.abs(z)) if n else 0.0
    n_adm = 0
    for bkp in range(min_size, n + 1):
        new = bkp - min_size  # floor((bkp - min_size) / jump) * jump with jump 1
        admissible[n_adm] = new
        n_adm += 1
        if has[new]:
            for i in range(min_size - 1):
                _add(low, high, sizes, sums, new, z[new + i])
        n_sub = 0
        ceiling = np.inf
        for i in range(n_adm):
            t = admissible[i]
            if not has[t]:  # no partition of 0:t (KeyError in ruptures): no subproblem
                continue
            _add(low, high, sizes, sums, t, z[bkp - 1])
            cost = sums[t, 1] - sums[t, 0]
            if sizes[t, 0] > sizes[t, 1]:
                cost += low[t, 0]  # the median sits in the lower half: sum of |s - m| = upper - lower + m
            subs[n_sub], approx[n_sub], known[n_sub] = t, total[t] + (cost + pen), False
            ceiling = min(ceiling, approx[n_sub] + _slack(approx[n_sub], bkp - t, biggest, n))
            n_sub += 1
        best, best_t = np.inf, -1
        for j in range(n_sub):  # the least exact total: among those whose slack reaches the ceiling
            if approx[j] - _slack(approx[j], bkp - subs[j], biggest, n) <= ceiling:
                t = subs[j]
                exact[j] = total[t] + (_exact_cost(z, t, bkp, _median(low, high, sizes, t), dev) + pen)
                known[j] = True
                if exact[j] < best:  # min() keeps the first of equal totals
                    best, best_t = exact[j], t
        total[bkp], has[bkp], came_from[bkp] = best, True, best_t
        # ruptures zips the admissible points with the subproblems, which skip the points without a partition
        kept = 0
        bound = best + pen
        for i in range(min(n_adm, n_sub)):
            slack = _slack(approx[i], bkp - subs[i], biggest, n)
            if known[i]:
                keep = exact[i] <= bound
            elif approx[i] + slack <= bound:
                keep = True
            elif approx[i] - slack > bound:
                keep = False
            else:
                t = subs[i]
                keep = total[t] + (_exact_cost(z, t, bkp, _median(low, high, sizes, t), dev) + pen) <= bound
            if keep:
                admissible[kept] = admissible[i]
                kept += 1
        n_adm = kept
    ends = []
    end = n
    while end > 0:
        ends.append(end)
        end = came_from[end]
    ends.reverse()
    return np.array(ends, dtype=np.int64)


@njit(cache=True)
def _slack(value, k, biggest, n):
    """A bound, a million times too wide, on how far a total from the halves' sums can be from ruptures' float."""
    return 1e6 * 2.3e-16 * (4 * n + 4 * k + 8) * (1.0 + abs(value) + k * biggest)
