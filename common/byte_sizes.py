"""Byte counts as people read them, the same in every report (plans, start-up, training
progress, export)."""

GIB = 1024**3
MIB = 1024**2


def format_bytes(n: int) -> str:
    """GiB from 1 GiB up, else MiB (0 as "0")."""
    if n == 0:
        return "0"
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.2f} MiB"
