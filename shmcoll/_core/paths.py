"""Where shmcoll keeps per-user files (the calibration, the job key)."""
import os
from pathlib import Path


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/shmcoll, or ~/.cache/shmcoll (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shmcoll"
