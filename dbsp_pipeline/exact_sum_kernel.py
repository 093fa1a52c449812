"""The fold of exact sums (``exact_sum.fold_arrow``) over whole columns, compiled (numba).

Per row of a table of touched groups, one pass adds to the group's old state (an encoded exact
sum, ``exact_sum.encode``) the step's finite pairs (doubles times weights) and, for a merge of
partial sums, the encoded sums of the pairs times their weights; then writes the new state's
text and the sum rounded once to the nearest double. The integers are those of
``exact_sum.of_pairs``: every finite double is an integer count of ``2**-1074``, held in 32-bit
limbs of int64 (``_LIMBS`` of them cover every double and every state the kernel takes, times a
weight below ``2**29``), so the result does not depend on the order of anything, and is bit for
bit that of ``exact_sum.fold_arrow_reference`` (``tests/test_exact_sum.py`` compares them).

A row the kernel does not take is marked ``slow`` and left to the caller's Python integers: a
state with NaN or infinity counts (``;``), or a mantissa of more than ``LONG_DIGITS`` hex
digits, or reaching past ``2**1024``; a row whose weights' magnitudes (pairs and states) sum
to ``WEIGHT_BOUND`` or more (no int64 limb may overflow); a result of more than ``LONG_BITS``
significant bits. The caller also marks the rows with NaN, infinite or NULL-weighted pairs.

Compiled at first use and cached beside this file (``cache=True``): a process pays the
compilation (about 2.5 s) once per installation, then the load of the cache (about 0.3 s, with
numba's import) at its first fold of ``exact_sum._VECTOR_ROWS`` rows or pairs or more.
"""

from __future__ import annotations

import math

import numba
import numpy as np

#: every finite double is an integer multiple of 2**-SCALE_BITS (``exact_sum.SCALE_BITS``)
SCALE_BITS = 1074
#: bits per limb
_LIMB = 32
#: limbs per row: 2**(70 * 32) is beyond every term (a state below 2**(1024 + 1074) or a double
#: below 2**(1024 + 1074), times a weight below 2**29) and their sums, with room for the sign
_LIMBS = 70
#: states with longer mantissas (hex digits) and results with more significant bits are left
#: to Python integers (``exact_sum._LONG_DIGITS`` / ``_LONG_BITS``)
LONG_DIGITS = 104
LONG_BITS = 4 * LONG_DIGITS
#: a row's weights' magnitudes must sum below this (``exact_sum._WEIGHT_BOUND``): every limb
#: term is below 2**33 times its weight, so no int64 sum of terms can overflow
WEIGHT_BOUND = 1 << 29
#: the longest state text written: '-', LONG_DIGITS hex digits, 'p', '-', four decimal digits
_TEXT_ROOM = 1 + LONG_DIGITS + 1 + 1 + 4
#: limbs above the highest one a row's terms changed that its carries may reach: a limb's sum
#: is below 2**62, so it carries below 2**30 into the next, and so on (two would do)
_CARRY = 3
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@numba.njit(cache=True, nogil=True, inline="always")
def _add_mantissa(acc: np.ndarray, mantissa: int, position: int, weight: int) -> int:
    """Add ``mantissa`` (below 2**60) at bit ``position`` times ``weight`` into ``acc``, as
    three limb terms (each below 2**33 times the weight); the lowest of the three limbs."""
    limb = position >> 5
    shift = position & 31
    low = (mantissa & 0xFFFFFFFF) << shift  # < 2**63
    high = (mantissa >> 32) << shift  # < 2**59
    acc[limb] += weight * (low & 0xFFFFFFFF)
    acc[limb + 1] += weight * ((low >> 32) + (high & 0xFFFFFFFF))
    acc[limb + 2] += weight * (high >> 32)
    return limb


@numba.njit(cache=True, nogil=True)
def _add_text(acc: np.ndarray, data: np.ndarray, start: int, end: int, weight: int
              ) -> tuple[int, int]:
    """Add the encoded finite sum ``data[start:end]`` times ``weight`` into ``acc``: the
    lowest and highest limb changed ((_LIMBS, -1) for none); (-1, -1), nothing added, for a
    text the kernel does not take (NaN or infinity counts, too long, reaching past 2**1024) or
    cannot read."""
    n = end - start
    if n == 0 or (n == 1 and data[start] == 48):  # "" or "0": nothing
        return _LIMBS, -1
    i = start
    sign = 1
    if data[i] == 45:  # '-'
        sign = -1
        i += 1
    digits_start = i
    while i < end and data[i] != 112:  # 'p'
        i += 1
    digits = i - digits_start
    if i >= end or digits == 0 or digits > LONG_DIGITS:
        return -1, -1
    i += 1
    exp_sign = 1
    if i < end and data[i] == 45:
        exp_sign = -1
        i += 1
    if i >= end:
        return -1, -1
    exponent = 0
    while i < end:
        c = data[i]
        if c < 48 or c > 57 or exponent > 100000:  # (';' of NaN or infinity counts, too)
            return -1, -1
        exponent = exponent * 10 + (c - 48)
        i += 1
    position = exp_sign * exponent + SCALE_BITS  # the bit of the mantissa's lowest digit
    if position < 0 or position + 4 * digits > 1024 + SCALE_BITS:
        return -1, -1
    w = sign * weight
    if digits <= 15:  # the mantissa in one int64 (below 2**60), added as three limb terms
        mantissa = 0
        for k in range(digits_start, digits_start + digits):
            c = data[k]
            if 48 <= c <= 57:
                mantissa = (mantissa << 4) | (c - 48)
            elif 97 <= c <= 102:
                mantissa = (mantissa << 4) | (c - 87)
            else:
                return -1, -1
        limb = _add_mantissa(acc, mantissa, position, w)
        return limb, limb + 2
    # the digits from the least significant, each nibble at its bit
    bit = position
    for k in range(digits_start + digits - 1, digits_start - 1, -1):
        c = data[k]
        if 48 <= c <= 57:
            nibble = c - 48
        elif 97 <= c <= 102:
            nibble = c - 87
        else:
            return -1, -1
        if nibble:
            limb = bit >> 5
            shift = bit & 31
            value = nibble << shift  # < 2**35
            acc[limb] += w * (value & 0xFFFFFFFF)
            acc[limb + 1] += w * (value >> 32)
        bit += 4
    return position >> 5, ((bit - 1) >> 5) + 1


@numba.njit(cache=True, nogil=True)
def _add_double(acc: np.ndarray, exponent: int, fraction: int, weight: int) -> int:
    """Add the finite double of IEEE fields ``exponent`` and ``fraction`` times ``weight``
    (carrying the value's sign) into ``acc``: ``mantissa * 2**scale`` in units of 2**-1074.
    The lowest limb changed (the two above it may be too); -1 for none (a zero)."""
    if exponent == 0 and fraction == 0:
        return -1
    mantissa = fraction if exponent == 0 else fraction | (1 << 52)
    return _add_mantissa(acc, mantissa, exponent - 1 if exponent > 0 else 0, weight)


@numba.njit(cache=True, nogil=True)
def _bits_at(mag: np.ndarray, position: int) -> np.uint64:
    """The 32 bits of the magnitude ``mag`` (uint64 limbs, each below 2**32) from bit
    ``position`` up (bits below 0 or past the top read as 0)."""
    if position >= 0:
        limb = position >> 5
        shift = position & 31
        low = mag[limb] >> np.uint64(shift) if limb < _LIMBS else np.uint64(0)
        high = np.uint64(0)
        if shift and limb + 1 < _LIMBS:
            high = (mag[limb + 1] << np.uint64(32 - shift)) & np.uint64(0xFFFFFFFF)
        return (low | high) & np.uint64(0xFFFFFFFF)
    if position <= -32:
        return np.uint64(0)
    return np.uint64((mag[0] << np.uint64(-position)) & np.uint64(0xFFFFFFFF))


@numba.njit(cache=True, nogil=True)
def fold_rows(rows: int, text_offsets: np.ndarray, text_data: np.ndarray,
              text_valid: np.ndarray, text_row: np.ndarray, text_weight: np.ndarray,
              pair_row: np.ndarray, pair_exponent: np.ndarray, pair_fraction: np.ndarray,
              pair_weight: np.ndarray, slow: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, the exact sum of its texts (encoded sums, ``text_offsets``/``text_data`` as in
    an Arrow string array, ``text_valid`` False for NULL, each of row ``text_row`` times
    ``text_weight``; sorted by row) and of its finite pairs (IEEE fields and signed weights,
    sorted by ``pair_row``): the new state's text (the bytes of all rows' texts in the first
    array, each row's offset into them in the second, as in an Arrow string array) and its
    value rounded once to a double (the third).
    Rows marked in ``slow`` on entry are skipped; rows the kernel cannot take are marked there
    (see the module docstring); neither has a text or value."""
    out = np.zeros(rows * _TEXT_ROOM, dtype=np.uint8)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    end = 0  # the texts written so far, one after the other
    values = np.zeros(rows, dtype=np.float64)
    acc = np.zeros(_LIMBS, dtype=np.int64)
    mag = np.zeros(_LIMBS, dtype=np.uint64)
    shown_low, shown_top = 0, _LIMBS - 1
    t = 0
    p = 0
    n_texts = len(text_row)
    n_pairs = len(pair_row)
    for row in range(rows):
        offsets[row] = end
        t0 = t
        while t < n_texts and text_row[t] == row:
            t += 1
        p0 = p
        while p < n_pairs and pair_row[p] == row:
            p += 1
        if slow[row]:
            continue
        # the weights' magnitudes, each checked before it is added (no int64 sum of them, nor
        # abs(-2**63), may wrap around)
        total_weight = 0
        for k in range(t0, t):
            w = text_weight[k]
            if text_valid[k] and total_weight < WEIGHT_BOUND:
                total_weight += w if 0 <= w < WEIGHT_BOUND else (
                    -w if -WEIGHT_BOUND < w < 0 else WEIGHT_BOUND)
        for k in range(p0, p):
            w = pair_weight[k]
            if total_weight < WEIGHT_BOUND:
                total_weight += w if 0 <= w < WEIGHT_BOUND else (
                    -w if -WEIGHT_BOUND < w < 0 else WEIGHT_BOUND)
        if total_weight >= WEIGHT_BOUND:
            slow[row] = True
            continue
        # the limbs [low, high] changed; carries reach at most _CARRY limbs above (every sum
        # of terms of a limb is below 2**63)
        low, high = _LIMBS, -1
        fits = True
        for k in range(t0, t):
            if text_valid[k]:
                first, last = _add_text(acc, text_data, text_offsets[k], text_offsets[k + 1],
                                        text_weight[k])
                if first < 0:
                    fits = False
                    break
                if last >= 0:
                    low, high = min(low, first), max(high, last)
        for k in range(p0, p):
            first = _add_double(acc, pair_exponent[k], pair_fraction[k], pair_weight[k])
            if first >= 0:
                low, high = min(low, first), max(high, first + 2)
        if not fits:
            acc[:] = 0
            slow[row] = True
            continue
        if high < 0:
            low = high = 0
        top = min(high + _CARRY, _LIMBS - 1)
        # carry: every limb but the top one into [0, 2**32); the top one holds the sign
        for k in range(low, top):
            acc[k + 1] += acc[k] >> 32
            acc[k] &= 0xFFFFFFFF
        negative = acc[top] < 0
        if negative:
            for k in range(low, top + 1):
                acc[k] = -acc[k]
            for k in range(low, top):
                acc[k + 1] += acc[k] >> 32
                acc[k] &= 0xFFFFFFFF
        mag[shown_low:shown_top + 1] = 0  # (the previous row's)
        shown_low, shown_top = low, top
        low_limb = -1
        high_limb = -1
        for k in range(low, top + 1):
            mag[k] = np.uint64(acc[k])
            if acc[k] != 0:
                if low_limb < 0:
                    low_limb = k
                high_limb = k
            acc[k] = 0  # (cleared for the next row)
        if low_limb < 0:  # zero
            out[end] = 48
            end += 1
            values[row] = 0.0
            continue
        lowest = np.int64(mag[low_limb])
        low_bit = 32 * low_limb
        while lowest & 1 == 0:
            lowest >>= 1
            low_bit += 1
        highest = np.int64(mag[high_limb])
        high_bit = 32 * high_limb - 1
        while highest:
            highest >>= 1
            high_bit += 1
        bits = high_bit - low_bit + 1
        if bits > LONG_BITS:
            slow[row] = True
            continue
        # the text: ['-'] hex digits of the odd mantissa, 'p', the exponent in decimal
        at = end
        if negative:
            out[at] = 45
            at += 1
        digits = (bits + 3) // 4
        if bits <= 64:  # the odd mantissa in one uint64, its digits from the top
            odd = (np.uint64(_bits_at(mag, low_bit + 32)) << np.uint64(32)) | _bits_at(
                mag, low_bit)
            for d in range(digits - 1, -1, -1):
                out[at] = _HEX[(odd >> np.uint64(4 * d)) & np.uint64(15)]
                at += 1
        else:
            for d in range(digits - 1, -1, -1):
                out[at] = _HEX[_bits_at(mag, low_bit + 4 * d) & np.uint64(15)]
                at += 1
        out[at] = 112
        at += 1
        exponent = low_bit - SCALE_BITS
        if exponent < 0:
            out[at] = 45
            at += 1
            exponent = -exponent
        width = 1
        while exponent >= 10 ** width:
            width += 1
        for d in range(width - 1, -1, -1):
            out[at + d] = 48 + exponent % 10
            exponent //= 10
        at += width
        end = at
        # the value: the top 64 bits rounded to 53, to nearest with ties to even (the bits
        # below them are non-zero exactly when the mantissa is longer than 64 bits: it is odd)
        leading = (np.uint64(_bits_at(mag, high_bit - 31)) << np.uint64(32)) | _bits_at(
            mag, high_bit - 63)
        kept = leading >> np.uint64(11)
        rest = leading & np.uint64(0x7FF)
        if rest > np.uint64(0x400) or (rest == np.uint64(0x400) and (
                bits > 64 or (kept & np.uint64(1)) == np.uint64(1))):
            kept += np.uint64(1)
        value = math.ldexp(float(kept), high_bit - 52 - SCALE_BITS)
        values[row] = -value if negative else value
    offsets[rows] = end
    return out[:end], offsets, values

