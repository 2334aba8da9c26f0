"""Byte sizes as people write them: '8', '4K', '1.5M', '2G' (powers of 1024)."""

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """'8', '4K', '1.5M', '2G' -> bytes."""
    s = str(text).strip().upper().removesuffix("IB").rstrip("B")
    try:
        return int(float(s[:-1]) * _UNITS[s[-1]]) if s and s[-1] in _UNITS else int(s)
    except ValueError:
        raise ValueError(f"invalid size {text!r} (use e.g. 8, 4K, 64M, 1G)") from None


def format_size(n):
    """Bytes -> the shortest exact form parse_size reads back: 65536 -> '64K'."""
    for unit in ("G", "M", "K"):
        if n and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def human_size(n):
    """Bytes for people: 8 B, 64 KiB, 1.5 MiB (binary units, as parse_size reads them)."""
    for unit in ("G", "M", "K"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:g} {unit}iB"
    return f"{n:g} B"
