"""Every SHMCOLL_* environment variable, declared once: name, type, default, doc.

``shmcoll info`` prints this table with the values in force.  This module has no
dependencies so that setup.py can read the build-time settings from it too.
"""
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: object
    doc: str

    def value(self, environ=None):
        raw = (os.environ if environ is None else environ).get(self.name)
        if raw is None or raw == "":
            return self.default
        try:
            if self.type is bool:
                return raw.strip().lower() in ("1", "true", "yes", "on")
            return self.type(raw)
        except ValueError:
            raise ValueError(f"{self.name}={raw!r} is not a valid {self.type.__name__}") from None


SETTINGS = {s.name: s for s in (
    Setting("SHMCOLL_TIMEOUT", float, 300.0,
            "Seconds any wait for a peer may last before shmcoll.TimeoutError; 'inf' waits "
            "without a deadline (a dead peer, an abort or Ctrl-C still end the wait)."),
    Setting("SHMCOLL_SPIN_US", float, None,
            "Microseconds a waiting rank busy-polls before it starts yielding its core; "
            "default: 50, or 0 when ranks outnumber the usable CPUs (a spinning rank would "
            "then hold the core its peer needs)."),
    Setting("SHMCOLL_YIELD_US", float, 2000.0,
            "Microseconds of sched_yield() polling after spinning, before sleeping on a futex."),
    Setting("SHMCOLL_SLOT_BYTES", int, 256 << 10,
            "Bytes per ring-buffer slot: the pipelining chunk of the ring algorithms."),
    Setting("SHMCOLL_SLOTS", int, 4,
            "Slots per channel (>= 2); a channel holds SLOTS x SLOT_BYTES."),
    Setting("SHMCOLL_STREAM_BYTES", int, 8 << 20,
            "Results of at least this many bytes are written with streaming (non-temporal) "
            "stores, which skip reading the destination into the cache; 0 disables."),
    Setting("SHMCOLL_ALGO", str, "",
            "Override the cost model: 'ring', or per collective and size range "
            "'allreduce:tree@0-64K,ring;broadcast:tree' (grammar in shmcoll.tuning.selector).  "
            "An explicit algo= argument still wins."),
    Setting("SHMCOLL_DEBUG", str, "",
            "INFO: log each algorithm decision once per (collective, size, world size) "
            "with the modelled time of every candidate, to stderr."),
    Setting("SHMCOLL_CALIBRATION", str, "",
            "Cost-model calibration file (default ~/.cache/shmcoll/calibration.json, "
            "written by `shmcoll calibrate`); 'off' ignores any calibration."),
    Setting("SHMCOLL_CMA", str, "auto",
            "Cross-memory attach (process_vm_readv/writev) for ordinary arrays: 'auto' "
            "probes at creation whether every rank may read and write every other's memory "
            "(same user, ptrace permitted: Yama's kernel.yama.ptrace_scope 0, no seccomp "
            "filter forbidding it) and then prices single-copy schedules beside the "
            "channels; 'off' (on any rank) "
            "keeps the whole job on the shared-memory path."),
    Setting("SHMCOLL_TUNE", str, "auto",
            "'auto': where the cost model prices schedules within 1.5x of its choice (cma "
            "within 2x by its price for bytes unchanged since its last read) and "
            "every rank has a usable CPU of its own, the first blocking calls of that size "
            "class try each and the ranks agree on the fastest (shmcoll.tuning.trials); "
            "'off': the model's choice alone (a pure function of the call: the same "
            "rounding from run to run).  The same on every rank."),
    Setting("SHMCOLL_RANK", int, None, "Join mode: this process's rank (shmcoll.init)."),
    Setting("SHMCOLL_WORLD_SIZE", int, None, "Join mode: number of ranks (shmcoll.init)."),
    Setting("SHMCOLL_JOB", str, None,
            "Join mode: job name; processes passing the same name form one communicator."),
    Setting("SHMCOLL_JOB_INSTANCE", str, None,
            "Join mode: an id of this launch of the job (any string, the same on all its "
            "ranks), so that two launches under one job name never share a segment.  "
            "Default: the launcher's own id where it gives one (Slurm's job and step id, "
            "PMIx's namespace, Open MPI's job id), else none."),
    Setting("SHMCOLL_JOIN_GRACE", float, 0.25,
            "Join mode without a launch instance id: seconds a formed job keeps its name "
            "visible before init() returns, so that a second job starting under the same "
            "name at the same moment (which processes belong to which cannot be told) "
            "refuses both instead of forming them with each other's ranks; 0 disables."),
    Setting("SHMCOLL_CUDA_BUFFER_BYTES", int, None,
            "Device arrays: bytes of each rank's CUDA IPC staging buffer (it holds two "
            "halves of this size); larger messages go through it in pieces, each costing "
            "a meeting of the ranks.  Default: the GPU's memory / 256, between 32 MiB and "
            "512 MiB (512 MiB on an 80 GB or larger GPU)."),
    Setting("SHMCOLL_CUDA_SYNC", str, "auto",
            "Device arrays: how ranks wait for each other.  'device': flag words in GPU "
            "memory, spun on by a kernel (nothing blocks the host); 'host': the stream is "
            "synchronised and the ranks meet in the shared-memory engine (no kernel spins "
            "while another process needs the GPU); 'auto': host when all ranks share one "
            "GPU, device otherwise."),
    Setting("SHMCOLL_CUDA_BACKEND", str, "cupy",
            "Device arrays: 'cupy' (CUDA IPC through CuPy), or 'host', a stand-in that keeps "
            "\"device\" buffers in host shared memory, for testing the GPU path without a GPU."),
    Setting("SHMCOLL_NODE", str, None,
            "shmcoll.mpi: the name of the node this rank is on; ranks with the same name "
            "share memory, the others talk through MPI.  Default: the nodes MPI finds "
            "(MPI_Comm_split_type SHARED).  Lets one machine play several nodes."),
    Setting("SHMCOLL_INTER_LINK", str, None,
            "shmcoll.mpi: the link between nodes its cost model prices, as BANDWIDTH:LATENCY "
            "(e.g. 25GB/s:2us, or ib-ndr).  Default: measured when the communicator is "
            "created, by an MPI ping-pong between the first two nodes (a few ms)."),
    Setting("SHMCOLL_BUILD_DEBUG", bool, False,
            "Build time: compile the C engine with -O0 -g and assertions instead of -O3."),
)}


def get(name, environ=None):
    """The value of a declared setting, from the environment or its default."""
    return SETTINGS[name].value(environ)


DEFAULT_SPIN_US = 50.0


def validate_timeout(timeout):
    """A timeout is a positive number of seconds; infinity means no deadline."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not timeout > 0:     # also refuses NaN
        raise ValueError(f"timeout must be positive seconds or float('inf'), got {timeout}")
    return float(timeout)


@dataclass(frozen=True)
class EngineParams:
    """The engine parameters a communicator is created with."""
    timeout: float
    spin_us: float
    yield_us: float
    slot_bytes: int
    nslots: int
    stream_bytes: int

    @classmethod
    def from_env(cls, world, timeout=None):
        from shmcoll._core.topology import usable_cpus   # setup.py reads this file alone
        spin = get("SHMCOLL_SPIN_US")
        if spin is None:
            spin = DEFAULT_SPIN_US if world <= usable_cpus() else 0.0
        params = cls(timeout=validate_timeout(get("SHMCOLL_TIMEOUT") if timeout is None
                                              else timeout),
                     spin_us=spin, yield_us=get("SHMCOLL_YIELD_US"),
                     slot_bytes=get("SHMCOLL_SLOT_BYTES"), nslots=get("SHMCOLL_SLOTS"),
                     stream_bytes=get("SHMCOLL_STREAM_BYTES"))
        params.validate()
        return params

    def validate(self):
        validate_timeout(self.timeout)
        if self.slot_bytes < 64 or self.slot_bytes % 64:
            raise ValueError(f"SHMCOLL_SLOT_BYTES must be a multiple of 64, got {self.slot_bytes}")
        if self.nslots < 2:
            raise ValueError(f"SHMCOLL_SLOTS must be at least 2, got {self.nslots}")
        if self.spin_us < 0 or self.yield_us < 0:
            raise ValueError("SHMCOLL_SPIN_US and SHMCOLL_YIELD_US must be >= 0")
