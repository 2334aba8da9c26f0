"""Who started this process: the rank, world size and job of init() without arguments,
read from the environment of the launcher that started it.

Launchers, in the order they are consulted (the first whose rank variable is set
decides; a launcher started under another sets its own variables last, so the inner
one comes first):

  shmcoll run / by hand  SHMCOLL_RANK, SHMCOLL_WORLD_SIZE, SHMCOLL_JOB
  torchrun               RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; job:
                         MASTER_ADDR and MASTER_PORT (else TORCHELASTIC_RUN_ID), with
                         TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT
  Open MPI               OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; job:
                         PMIX_NAMESPACE, else OMPI_MCA_ess_base_jobid
  MPICH (Hydra), PMI     PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS; job:
                         PMIX_NAMESPACE, PMI_KVSNAME or PMI_PORT, else the parent
                         process (Hydra's proxy, shared by one launch's ranks)
  Slurm (srun)           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NUM_NODES;
                         job: SLURM_JOB_ID and SLURM_STEP_ID

The job's name comes from the launcher's job id, so two launches never share one.
shmcoll joins the processes of one machine: a launch spanning several (its local
world smaller than its world) is refused rather than joined in part.  A rank without
a world size, a job without an id, values that are not integers or out of range are
errors naming the variables found.
"""
import os
from typing import Callable, NamedTuple, Optional, Sequence, Tuple


class Launch(NamedTuple):
    rank: int
    world_size: int
    job: str
    instance: Optional[str]     # the launch's own id (None: SHMCOLL_JOB without one)
    launcher: str               # who said so, for messages


class _Launcher(NamedTuple):
    name: str
    rank: str
    size: str
    local_rank: Optional[str]
    local_size: Optional[str]
    job_ids: Sequence[Tuple[str, ...]]          # the first complete one names the job
    fallback_job: Optional[Callable[[], str]] = None
    job_extra: Tuple[str, ...] = ()             # added to the job id when set


def _parent_process():
    return f"parent process {os.getppid()}"


LAUNCHERS = (
    # (the run id is "none" unless given, the store's port is the launch's own, and a
    # restarted worker group is a new job)
    _Launcher("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
              (("MASTER_ADDR", "MASTER_PORT"), ("TORCHELASTIC_RUN_ID",)),
              job_extra=("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")),
    _Launcher("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
              "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
              (("PMIX_NAMESPACE",), ("OMPI_MCA_ess_base_jobid",))),
    _Launcher("MPICH/PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
              (("PMIX_NAMESPACE",), ("PMI_KVSNAME",), ("PMI_PORT",)), _parent_process),
    _Launcher("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None,
              (("SLURM_JOB_ID", "SLURM_STEP_ID"),)),
)


def _found(env, names):
    return ", ".join(f"{n}={env[n]}" for n in names if n and n in env) or "none"


def _integer(env, name, launcher, names):
    text = env.get(name, "")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"init(): {launcher} variable {name}={text!r} is not an integer "
                         f"(found: {_found(env, names)})") from None


def _job_id(env, launcher):
    for names in launcher.job_ids:
        if all(env.get(n) for n in names):
            names += tuple(n for n in launcher.job_extra if env.get(n) and n not in names)
            return "/".join(f"{n}={env[n]}" for n in names)
    return launcher.fallback_job() if launcher.fallback_job else None


def _one_machine(env, launcher, world, names):
    """The launch's ranks on this machine are all of them, or an error."""
    local = None
    if launcher.local_size and env.get(launcher.local_size):
        local = _integer(env, launcher.local_size, launcher.name, names)
    elif launcher.name == "Slurm":
        nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES")
        if nodes and nodes != "1":
            local = -1
    if local is not None and local != world:
        raise ValueError(
            f"init(): this {launcher.name} launch spans more than one machine "
            f"({_found(env, names + ('SLURM_STEP_NUM_NODES', 'SLURM_NNODES'))}); "
            f"shmcoll joins the processes of one machine: pass rank=, world_size= and job= "
            f"for this machine's ranks (its local rank and size), or use shmcoll.mpi "
            f"across machines")


def from_launcher(env, launcher):
    names = tuple(n for n in (launcher.rank, launcher.size, launcher.local_rank,
                              launcher.local_size) if n)
    names += tuple(n for ids in launcher.job_ids for n in ids)
    if not env.get(launcher.size):
        raise ValueError(f"init(): {launcher.name}'s rank is set but not its world size "
                         f"{launcher.size} (found: {_found(env, names)})")
    rank = _integer(env, launcher.rank, launcher.name, names)
    world = _integer(env, launcher.size, launcher.name, names)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"init(): {launcher.name} says rank {rank} of {world}, which is "
                         f"not a rank (found: {_found(env, names)})")
    _one_machine(env, launcher, world, names)
    job = _job_id(env, launcher)
    if job is None:
        raise ValueError(f"init(): {launcher.name} gives no job id to name the job by "
                         f"(found: {_found(env, names)}); set SHMCOLL_JOB (the same on "
                         f"every rank, unique to the launch)")
    return Launch(rank, world, f"{launcher.name}:{job}", job, launcher.name)


def detect(env=None) -> Optional[Launch]:
    """This process's launch as its launcher's environment describes it, None when no
    launcher's rank variable is set (SHMCOLL_* are read by init() itself)."""
    env = os.environ if env is None else env
    for launcher in LAUNCHERS:
        if env.get(launcher.rank):
            return from_launcher(env, launcher)
    return None
