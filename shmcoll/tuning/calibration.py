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

from shmcoll._core.paths import cache_dir
from shmcoll._core.settings import get
from shmcoll._core.topology import job_cpus, online_cpus
from shmcoll.tuning.algorithms.terms import CostModel, Models

VERSION = 2
PARAMETERS = ("alpha", "overhead", "beta", "gamma")


def _model(alpha_us, overhead_us, beta_gbs, gamma_gbs, **setup_us):
    return CostModel(alpha=alpha_us * 1e-6, overhead=overhead_us * 1e-6, beta=1 / (beta_gbs * 1e9),
                     gamma=1 / (gamma_gbs * 1e9),
                     setup=tuple(sorted((a, v * 1e-6) for a, v in setup_us.items())))


# Without a calibration of its own, a machine uses REFERENCE_FILE: the output of
# `shmcoll calibrate -np 2 4` on the 2-core x86-64 VM the project is developed on —
# 2 ranks for worlds that fit the usable CPUs, 4 ranks (twice the cores, where a step
# may wait for a context switch) for worlds that do not.  FALLBACK is used if that
# file is missing or unreadable.
REFERENCE_FILE = Path(__file__).with_name("reference_calibration.json")
FALLBACK = Models(_model(0.5, 0.1, 15, 20))
FALLBACK_OVERSUBSCRIBED = Models(_model(2.0, 1.0, 8, 20))
# The GPU path until `shmcoll calibrate --device cuda` has measured it: round figures
# for one GPU's ranks — a step is a kernel launch plus a flag round trip through
# system-scope memory, a message a copy launch, bytes move at HBM speed.
DEVICE_DEFAULT = Models(_model(6.0, 1.0, 1500, 1500))


def _reference():
    try:
        data = json.loads(REFERENCE_FILE.read_text())
        return {key: _models_from_entry(data[key], FALLBACK.default)
                for key in ("fits", "oversubscribed")}
    except (OSError, ValueError, KeyError, TypeError):
        return {"fits": FALLBACK, "oversubscribed": FALLBACK_OVERSUBSCRIBED}


def cache_path():
    explicit = get("SHMCOLL_CALIBRATION")
    if explicit and explicit != "off":
        return Path(explicit).expanduser()
    return cache_dir() / "calibration.json"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(device=None):
    """The CPU model and counts; with `device` (a GPU's name), that GPU's key."""
    key = f"{_cpu_model()} | {online_cpus()} cpus | {job_cpus()} usable"
    return f"{key} | {device}" if device else key


def _read(path):
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {"version": VERSION, "machines": {}}
    if data.get("version") != VERSION or not isinstance(data.get("machines"), dict):
        return {"version": VERSION, "machines": {}}
    return data


def load(world, path=None, device=None):
    """The calibrated entry for this machine (or its GPU) and world size, or None."""
    if get("SHMCOLL_CALIBRATION") == "off":
        return None
    entry = _read(path or cache_path())["machines"].get(machine_key(device), {}).get(str(world))
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


_REFERENCE = None


def default_model(world):
    """The reference calibration for a world that fits the job's CPUs, or not (the
    same answer on every rank, however each is bound)."""
    global _REFERENCE
    if _REFERENCE is None:
        _REFERENCE = _reference()
    return _REFERENCE["fits" if world <= job_cpus() else "oversubscribed"]


def _models_from_entry(entry, base):
    by = tuple(sorted((c, model_from_dict(d)) for c, d in entry["collectives"].items()))
    return Models(base, by)


def model_for(world, path=None, device=None):
    """(Models, source): the calibration for (machine, world) — for the GPU path,
    (machine and GPU, world) — else the defaults."""
    entry = load(world, path, device)
    base = DEVICE_DEFAULT if device else default_model(world)
    if entry is None:
        return base, "default"
    try:
        models = _models_from_entry(entry, base.default)
    except (KeyError, TypeError, ValueError):
        return base, "default (calibration entry unreadable)"
    return models, f"calibrated {entry.get('when', '')}".strip()


def save(world, models, extra=None, path=None, device=None):
    """Stores {collective: (CostModel, fit error)} for (this machine, world)
    atomically; returns the path."""
    path = Path(path or cache_path())
    data = _read(path)
    collectives = {c: dict(m.as_dict(), rms_rel_error=round(err, 4)) for c, (m, err) in models.items()}
    entry = dict(collectives=collectives, when=time.strftime("%Y-%m-%d %H:%M:%S"), **(extra or {}))
    data["machines"].setdefault(machine_key(device), {})[str(world)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path
