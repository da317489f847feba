"""PostgreSQL log sequence numbers.

An LSN is an unsigned 64-bit byte position in the WAL, written ``"16/3002D50"`` (high and low
32 bits in hex). lakecdc stores LSNs as ``bigint``: real LSNs stay far below 2**63, so the
signed value orders the same way as the unsigned one.
"""

from __future__ import annotations

from functools import total_ordering

_MAX = 2**64 - 1


@total_ordering
class Lsn:
    """An LSN value: parse from text, compare, format back."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        if not 0 <= value <= _MAX:
            raise ValueError(f"LSN out of range: {value}")
        self.value = value

    @classmethod
    def parse(cls, text: str) -> "Lsn":
        """Parse ``"16/3002D50"``; raises ``ValueError`` on anything else."""
        hi, sep, lo = text.strip().partition("/")
        if not sep or not hi or not lo or len(hi) > 8 or len(lo) > 8:
            raise ValueError(f"not an LSN: {text!r}")
        try:
            return cls((int(hi, 16) << 32) | int(lo, 16))
        except ValueError:
            raise ValueError(f"not an LSN: {text!r}") from None

    def __int__(self) -> int:
        return self.value

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lsn) and other.value == self.value

    def __lt__(self, other: "Lsn") -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)


def fmt(value: int | None) -> str:
    """Text form of a stored ``bigint`` LSN (``"-"`` when there is none)."""
    return "-" if value is None else str(Lsn(value))
