"""Machine parameters of the cost model: defaults, and the calibrated ones in a
per-user cache file keyed by machine and world size (``shmcoll calibrate``).

The file is JSON: {"version": 1, "machines": {KEY: {"P": {"alpha": ..., ...}}}},
where KEY names the CPU model and CPU counts, so a cache shared between hosts (a
home directory on NFS) never applies one machine's numbers to another.
"""
import json
import os
import platform
import time
from pathlib import Path

from shmcoll.algorithms.terms import CostModel
from shmcoll.config import get, usable_cpus

VERSION = 1
PARAMETERS = ("alpha", "overhead", "beta", "gamma")

# Measured with `shmcoll calibrate` on a 2-core x86-64 VM.  When ranks outnumber
# cores a step may wait for a context switch, which dominates α.
DEFAULT = CostModel(alpha=1e-6, overhead=0.2e-6, beta=1 / 2.5e9, gamma=1 / 5e9)
DEFAULT_OVERSUBSCRIBED = CostModel(alpha=10e-6, overhead=1e-6, beta=1 / 2.5e9, gamma=1 / 5e9)


def cache_path():
    explicit = get("SHMCOLL_CALIBRATION")
    if explicit and explicit != "off":
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "shmcoll" / "calibration.json"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key():
    return f"{_cpu_model()} | {os.cpu_count()} cpus | {usable_cpus()} usable"


def _read(path):
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {"version": VERSION, "machines": {}}
    if data.get("version") != VERSION or not isinstance(data.get("machines"), dict):
        return {"version": VERSION, "machines": {}}
    return data


def load(world, path=None):
    """The calibrated entry for this machine and world size, or None."""
    if get("SHMCOLL_CALIBRATION") == "off":
        return None
    entry = _read(path or cache_path())["machines"].get(machine_key(), {}).get(str(world))
    if not entry or not all(isinstance(entry.get(k), (int, float)) for k in PARAMETERS):
        return None
    return entry


def default_model(world):
    return DEFAULT if world <= usable_cpus() else DEFAULT_OVERSUBSCRIBED


def model_for(world, path=None):
    """(CostModel, source): the calibration for (machine, world), else the default."""
    entry = load(world, path)
    if entry is None:
        return default_model(world), "default"
    setup = entry.get("setup") if isinstance(entry.get("setup"), dict) else {}
    model = CostModel(**{k: float(entry[k]) for k in PARAMETERS},
                      setup=tuple(sorted((str(a), float(v)) for a, v in setup.items())))
    return model, f"calibrated {entry.get('when', '')}".strip()


def save(world, model, extra=None, path=None):
    """Stores `model` for (this machine, world) atomically; returns the path."""
    path = Path(path or cache_path())
    data = _read(path)
    entry = dict(model.as_dict(), when=time.strftime("%Y-%m-%d %H:%M:%S"), **(extra or {}))
    data["machines"].setdefault(machine_key(), {})[str(world)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path
