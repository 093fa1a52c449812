"""Spark's ``xxhash64`` and the engine's shard, computed on the driver over Arrow data (no Spark).

The engine shards state by ``xxhash64(key columns)`` (see :mod:`dbsp_pipeline.zset`). Rows written
by Spark and rows written on the driver go to the same state tables and are looked up by shard, so
the driver must produce *bit-identical* numbers. This module re-implements Spark's
``XxHash64(children, seed=42)`` expression for the types listed in :func:`supports`.

Contract
--------
``xxhash64_arrow(table, cols)[i] == Spark's xxhash64(cols...)`` for row ``i`` of ``table``, and
``shard_arrow(table, cols)[i] == shiftrightunsigned(xxhash64(cols...), 54).cast("int")``. Shards
are persisted in state tables, so the value must never change: Spark's hash is the same in every
Spark version and on every worker, and this implementation depends only on the XXH64 algorithm
and the rules below (no Spark, no hash randomization). It is tested against Spark itself
(``tests/driver/test_hashing.py``).

Spark's rules (``HashExpression`` / ``XxHash64Function`` in catalyst)
---------------------------------------------------------------------
The hash of a row starts at seed 42; each column, in order, updates it: ``h = hash(v, seed=h)``.
A NULL leaves ``h`` unchanged. Per value:

* boolean -> ``hashInt(1 or 0)``; byte / short / int / date (days since epoch) -> ``hashInt``;
* long / timestamp / timestamp_ntz (microseconds since epoch) -> ``hashLong``;
* float -> ``hashInt(floatToIntBits(f))`` with -0.0 hashed as 0.0 and every NaN as the canonical
  NaN; double -> ``hashLong(doubleToLongBits(d))`` likewise;
* decimal(p, s) with ``p <= 18`` -> ``hashLong(unscaled value)``; with ``p > 18`` -> the bytes of
  ``unscaledValue().toByteArray()`` (Java ``BigInteger``: minimal big-endian two's complement).
  The *type's* precision decides, not the value's;
* string (binary collation) -> the UTF-8 bytes; binary -> the bytes.

``hashInt`` / ``hashLong`` are standard XXH64 of the 4 / 8 little-endian bytes of the value and the
byte hashes are standard XXH64 of the bytes (Spark's ``XXH64.hashUnsafeBytes``), all with the
running ``h`` as seed.

Implementation: each column updates the running hashes in one compiled pass
(``driver/hashing_kernel.py``: XXH64 of 4 or 8 bytes, or of each value's bytes, with a per-row
seed); wide decimals (their bytes built by Python's ``int``) loop over ``xxhash.xxh64_intdigest``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import xxhash
from pyspark.sql import types as T

from dbsp_pipeline.zset import SHARD_BITS

__all__ = ["supports", "xxhash64_arrow", "shard_arrow", "spark_hash_int"]

#: Spark's seed for ``xxhash64``.
SEED = 42
#: Widest decimal precision Spark hashes as a long (``Decimal.MAX_LONG_DIGITS``).
_MAX_LONG_DIGITS = 18

_FLOAT_NAN_BITS = np.uint32(0x7FC00000)          # Java Float.floatToIntBits(NaN)
_DOUBLE_NAN_BITS = np.uint64(0x7FF8000000000000)  # Java Double.doubleToLongBits(NaN)

_SUPPORTED_SPARK_TYPES = (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType,
                          T.FloatType, T.DoubleType, T.DecimalType, T.DateType, T.TimestampType,
                          T.TimestampNTZType, T.BinaryType, T.NullType)


def supports(data_type: T.DataType) -> bool:
    """Whether :func:`xxhash64_arrow` can hash a column of this Spark type.

    True for boolean, byte, short, int, long, float, double, decimal (any precision), string with
    the default ``UTF8_BINARY`` collation, binary, date, timestamp, timestamp_ntz and null. False
    for everything else: arrays, maps, structs, intervals, variants, char/varchar, and strings with
    another collation (how Spark hashes those has changed between Spark versions: collation-aware
    in 4.0, raw bytes by default in 4.3, so they are not a stable shard key).
    """
    if isinstance(data_type, T.StringType):
        return getattr(data_type, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    return isinstance(data_type, _SUPPORTED_SPARK_TYPES)


def spark_hash_int(value: int) -> int:
    """Spark's ``hash()`` of one INT ``value`` (Murmur3 x86 32-bit, seed 42), signed: what
    Spark's hash partitioning puts a row by (``repartition(n, col)`` sends it to partition
    ``pmod(hash, n)``)."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    k1 = rotl((value & mask) * 0xCC9E2D51 & mask, 15) * 0x1B873593 & mask
    h1 = (rotl(SEED ^ k1, 13) * 5 + 0xE6546B64) & mask
    h1 ^= 4  # the length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & mask
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


# --- Arrow access ---------------------------------------------------------------------------------

def buffer_values(arr: pa.Array, dtype: np.dtype, width: int = 1) -> np.ndarray:
    """The fixed-width data buffer of ``arr`` as numpy (zero copy; NULL slots hold garbage)."""
    buf = arr.buffers()[1]
    n = (arr.offset + len(arr)) * width
    return np.frombuffer(buf, dtype=dtype, count=n)[arr.offset * width:]


def _int_bits(arr: pa.Array, dtype: str) -> np.ndarray:
    """Sign-extended to 32 bits, as the uint32 pattern in a uint64 (Java int widening)."""
    return buffer_values(arr, np.dtype(dtype)).astype(np.int32).view(np.uint32).astype(np.uint64)


def _float_bits(arr: pa.Array) -> np.ndarray:
    v = buffer_values(arr, np.dtype(np.float32))
    bits = v.view(np.uint32)
    bits = np.where(v == 0, np.uint32(0), bits)          # -0.0 -> 0.0
    bits = np.where(np.isnan(v), _FLOAT_NAN_BITS, bits)  # canonical NaN
    return bits.astype(np.uint64)


def _double_bits(arr: pa.Array) -> np.ndarray:
    v = buffer_values(arr, np.dtype(np.float64))
    bits = v.view(np.uint64)
    bits = np.where(v == 0, np.uint64(0), bits)
    return np.where(np.isnan(v), _DOUBLE_NAN_BITS, bits)


def bytes_hashes(arr: pa.Array, seeds: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """XXH64 of each value of the string or binary array ``arr`` with its row's seed (NULL rows
    keep it)."""
    from dbsp_pipeline.driver import hashing_kernel

    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    buffers = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32,
                            count=arr.offset + n + 1)[arr.offset:].astype(np.int64)
    data = (np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None
            else np.zeros(0, dtype=np.uint8))
    return hashing_kernel.hash_bytes(offsets, data, seeds, valid)


def _decimal_wide_hashes(arr: pa.Array, seeds: np.ndarray, valid: np.ndarray | None
                         ) -> np.ndarray:
    """Decimals of precision > 18: XXH64 of ``BigInteger.toByteArray()`` of the unscaled value.

    That is the minimal big-endian two's complement: ``bitLength() // 8 + 1`` bytes, where Java's
    ``bitLength`` of a negative ``x`` is Python's ``(~x).bit_length()``.
    """
    width = arr.type.byte_width
    view = memoryview(arr.buffers()[1])[arr.offset * width:(arr.offset + len(arr)) * width]
    from_bytes = int.from_bytes
    digest = xxhash.xxh64_intdigest
    sds = seeds.tolist()
    ok = valid.tolist() if valid is not None else None
    out = []
    for i in range(len(arr)):
        if ok is not None and not ok[i]:
            out.append(sds[i])
            continue
        x = from_bytes(view[i * width:(i + 1) * width], "little", signed=True)
        size = (x if x >= 0 else ~x).bit_length() // 8 + 1
        out.append(digest(x.to_bytes(size, "big", signed=True), sds[i]))
    return np.array(out, dtype=np.uint64)


def _arrow_supported(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _arrow_supported(t.value_type)
    return bool(pa.types.is_null(t) or pa.types.is_boolean(t) or pa.types.is_int8(t)
            or pa.types.is_int16(t) or pa.types.is_int32(t) or pa.types.is_int64(t)
            or pa.types.is_float32(t) or pa.types.is_float64(t) or pa.types.is_decimal128(t)
            or pa.types.is_decimal256(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_string_view(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
            or pa.types.is_date32(t) or pa.types.is_timestamp(t))


def _update(arr: pa.Array, h: np.ndarray) -> np.ndarray:
    """The running hashes ``h`` (uint64, one per row) updated with the values of ``arr``."""
    from dbsp_pipeline.driver import hashing_kernel

    t = arr.type
    n = len(arr)
    if not _arrow_supported(t):
        raise TypeError(f"xxhash64_arrow: unsupported Arrow type {t}")
    if n == 0 or pa.types.is_null(t) or arr.null_count == n:
        return h
    if pa.types.is_dictionary(t):
        return _update(arr.dictionary_decode(), h)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _update(arr.cast(pa.large_binary()), h)
    valid = (np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
             if arr.null_count else np.ones(n, dtype=bool))

    if (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t)):
        return bytes_hashes(arr, h, valid)
    if pa.types.is_decimal(t):
        if t.precision > _MAX_LONG_DIGITS:
            return _decimal_wide_hashes(arr, h, valid if arr.null_count else None)
        words = 2 if pa.types.is_decimal128(t) else 4
        return hashing_kernel.hash_longs(
            np.ascontiguousarray(buffer_values(arr, np.dtype("<u8"), words)[::words]), h, valid)
    if pa.types.is_boolean(t):
        bits = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64)
        return hashing_kernel.hash_ints(bits, h, valid)
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return hashing_kernel.hash_ints(_int_bits(arr, str(t)), h, valid)
    if pa.types.is_date32(t):
        return hashing_kernel.hash_ints(_int_bits(arr, "int32"), h, valid)
    if pa.types.is_int64(t):
        return hashing_kernel.hash_longs(buffer_values(arr, np.dtype(np.uint64)), h, valid)
    if pa.types.is_timestamp(t):
        if t.unit != "us":  # Spark's timestamps are microseconds; refuse lossy conversions
            arr = arr.cast(pa.timestamp("us", tz=t.tz), safe=True)
        return hashing_kernel.hash_longs(buffer_values(arr, np.dtype(np.uint64)), h, valid)
    if pa.types.is_float32(t):
        return hashing_kernel.hash_ints(_float_bits(arr), h, valid)
    # float64, the last type _arrow_supported admits
    return hashing_kernel.hash_longs(_double_bits(arr), h, valid)


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


# --- public API ----------------------------------------------------------------------------------

def xxhash64_arrow(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """Spark's ``xxhash64(columns...)`` (seed 42) of every row of ``table``, as int64.

    Bit-identical to Spark for the Arrow types Spark's ``toArrow`` produces for the Spark types
    :func:`supports` accepts: bool, int8/16/32/64, float32/64, decimal128 (decimal256 also
    works), string / large_string / string_view, binary / large_binary / binary_view, date32,
    timestamp (with or without time zone; microseconds, other units are converted exactly or
    rejected) and null. The Arrow type must carry the Spark type's semantics: a Spark
    ``decimal(p, s)`` column must arrive as ``decimal128(p, s)`` (the precision decides how it is
    hashed) and a Spark ``int`` as ``int32`` (an int32 is hashed as 4 bytes, an int64 as 8).

    With no columns every row hashes to the seed (42); Spark itself rejects ``xxhash64()``.
    Raises ``TypeError`` for unsupported Arrow types and ``KeyError`` for missing columns.
    """
    n = table.num_rows
    h = np.full(n, SEED, dtype=np.uint64)
    for name in columns:
        h = _update(_column(table, name), h)
    return h.view(np.int64)


def shard_arrow(table: pa.Table, columns: Sequence[str]) -> pa.Array:
    """The engine's shard of every row: ``shiftrightunsigned(xxhash64(columns...), 54)``.

    An ``int32`` array of values in ``0..1023`` (the top ``SHARD_BITS`` bits of the hash), equal to
    :func:`dbsp_pipeline.zset.shard_of` computed by Spark; all zeros when ``columns`` is empty
    (as ``shard_of`` does).
    """
    if not columns:
        return pa.array(np.zeros(table.num_rows, dtype=np.int32), type=pa.int32())
    hashed = xxhash64_arrow(table, columns).view(np.uint64)
    return pa.array((hashed >> np.uint64(64 - SHARD_BITS)).astype(np.int32), type=pa.int32())
