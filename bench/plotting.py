"""matplotlib for the benchmarks' plots, or None (it is in the ``bench`` extra only)."""

from __future__ import annotations

import sys
from types import ModuleType


def pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` on the file-only Agg backend; None, said on stderr, without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError:
        print("bench: matplotlib is not installed (pip install -e '.[bench]'): no plot",
              file=sys.stderr)
        return None
    plt: ModuleType = matplotlib.pyplot
    return plt
