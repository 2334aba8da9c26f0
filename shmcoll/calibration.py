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

from shmcoll.algorithms.terms import CostModel, Models
from shmcoll.config import get, usable_cpus

VERSION = 2
PARAMETERS = ("alpha", "overhead", "beta", "gamma")


def _model(alpha_us, overhead_us, beta_gbs, gamma_gbs, **setup_us):
    return CostModel(alpha=alpha_us * 1e-6, overhead=overhead_us * 1e-6, beta=1 / (beta_gbs * 1e9),
                     gamma=1 / (gamma_gbs * 1e9),
                     setup=tuple(sorted((a, v * 1e-6) for a, v in setup_us.items())))


# Defaults: `shmcoll calibrate` on a 2-core x86-64 VM (2 ranks; 4 ranks when ranks
# outnumber cores, where a step may wait for a context switch).
DEFAULT = Models(_model(0.3, 0.1, 15, 20))
DEFAULT_OVERSUBSCRIBED = Models(_model(1.5, 1.0, 12, 20))


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
    if not isinstance(entry, dict) or not isinstance(entry.get("collectives"), dict):
        return None
    return entry


def model_from_dict(d):
    """CostModel from {"alpha": s, "overhead": s, "beta": s/B, "gamma": s/B, "setup": {...}}."""
    def pairs(key):
        table = d.get(key) if isinstance(d.get(key), dict) else {}
        return tuple(sorted((str(a), float(v)) for a, v in table.items()))
    return CostModel(**{k: float(d[k]) for k in PARAMETERS}, setup=pairs("setup"),
                     bandwidth=pairs("bandwidth"))


def default_model(world):
    return DEFAULT if world <= usable_cpus() else DEFAULT_OVERSUBSCRIBED


def model_for(world, path=None):
    """(Models, source): the calibration for (machine, world), else the defaults."""
    entry = load(world, path)
    if entry is None:
        return default_model(world), "default"
    try:
        by = tuple(sorted((c, model_from_dict(d)) for c, d in entry["collectives"].items()))
    except (KeyError, TypeError, ValueError):
        return default_model(world), "default (calibration entry unreadable)"
    base = default_model(world).default
    return Models(base, by), f"calibrated {entry.get('when', '')}".strip()


def save(world, models, extra=None, path=None):
    """Stores {collective: (CostModel, fit error)} for (this machine, world)
    atomically; returns the path."""
    path = Path(path or cache_path())
    data = _read(path)
    collectives = {c: dict(m.as_dict(), rms_rel_error=round(err, 4)) for c, (m, err) in models.items()}
    entry = dict(collectives=collectives, when=time.strftime("%Y-%m-%d %H:%M:%S"), **(extra or {}))
    data["machines"].setdefault(machine_key(), {})[str(world)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path
