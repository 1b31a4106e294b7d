"""What the launcher told this process, read in one place: its rank and the job's size, which
launcher started it (mpirun, srun, horovodrun's Gloo or elastic driver, none), where a
rendezvous finds rank 0, and what a Slurm job adds to a run's records. Known before any
communication starts; nothing here communicates.

    {"slurm_job_id": "42", "slurm_nodes": "n[1-2]", "slurm_restart_count": 1}   # slurm_facts()

``slurm_restart_count`` is Slurm's SLURM_RESTART_COUNT: 0 on a job's first run, then one more
each time it is requeued (by ``scontrol requeue``, a preemption, or launch/slurm.sbatch itself).
"""
from __future__ import annotations

import os
from typing import Mapping

_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE")
# Launchers leave these in every rank's environment: Open MPI's mpirun (also under horovodrun's
# MPI mode), MPICH/Hydra's PMI, PMIx (e.g. srun --mpi=pmix).
_MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
# Launchers of several processes that are no MPI job (horovodrun --gloo, torchrun).
_NON_MPI_SIZE_VARS = ("HOROVOD_SIZE", "WORLD_SIZE")


def launch_rank() -> int:
    """This process's rank as the launcher set it."""
    for var in _RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def launch_size() -> int:
    """Ranks in this job as the launcher set them (1 when none did)."""
    return next((int(os.environ[v]) for v in _SIZE_VARS if os.environ.get(v, "").isdigit()), 1)


def spans_hosts() -> bool:
    """Whether the launcher placed this job's ranks on more than one host: Open MPI's local and
    world sizes (mpirun, horovodrun's MPI mode), else the nodes of the Slurm step."""
    local, world = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", ""), os.environ.get("OMPI_COMM_WORLD_SIZE", "")
    if local.isdigit() and world.isdigit():
        return int(local) < int(world)
    nodes = os.environ.get("SLURM_STEP_NUM_NODES") or os.environ.get("SLURM_NNODES") or ""
    return nodes.isdigit() and int(nodes) > 1


def launched_by_mpi() -> bool:
    """Whether an MPI launcher started this process (so MPI_Abort reaches the whole job)."""
    return any(var in os.environ for var in _MPI_VARS)


def horovod_gloo() -> bool:
    """Whether horovodrun --gloo started this process (Horovod's Gloo rendezvous, no MPI)."""
    return "HOROVOD_SIZE" in os.environ and not launched_by_mpi()


def non_mpi_size() -> tuple[str, int] | None:
    """(variable, size) when a launcher that is not MPI started several processes, else None."""
    for var in _NON_MPI_SIZE_VARS:
        size = os.environ.get(var, "")
        if size.isdigit() and int(size) > 1:
            return var, int(size)
    return None


def rendezvous_host(default: str) -> str:
    """The address the other ranks reach rank 0 by: the one the launcher used for it."""
    return os.environ.get("MASTER_ADDR") or os.environ.get("HOROVOD_HOSTNAME") or default


def gloo_interface() -> str | None:
    """The network interface horovodrun found common to every host (Gloo mode)."""
    return os.environ.get("HOROVOD_GLOO_IFACE")


def launcher_name() -> str:
    """What started the ranks, as far as the environment tells: horovodrun's MPI mode runs
    mpirun, and its ranks see the same variables as plain mpirun's."""
    if os.environ.get("HOROVOD_ELASTIC") == "1":
        return "horovodrun-elastic"
    # Open MPI's mpirun gives each process it starts its OMPI_COMM_WORLD_* variables; a task that
    # srun started through PMIx has a Slurm step and PMIx's rank, but none of those.
    if "SLURM_STEP_ID" in os.environ and "PMIX_RANK" in os.environ and "OMPI_COMM_WORLD_SIZE" not in os.environ:
        return "srun (PMIx)"
    if launched_by_mpi():
        return "mpi (mpirun, or horovodrun over MPI)"
    if "HOROVOD_RANK" in os.environ:
        return "horovodrun-gloo"
    return "single-process"


def slurm_facts(env: Mapping[str, str] | None = None) -> dict:
    """What a Slurm job's environment says about the run that trains in it, in one shape wherever
    a run notes it (meta.json, each ``preempted`` and ``rank_lost`` line of events.jsonl); outside
    Slurm (no SLURM_JOB_ID) nothing."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        return {}
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    return {"slurm_job_id": job, "slurm_nodes": env.get("SLURM_JOB_NODELIST", ""),
            "slurm_restart_count": int(restarts) if restarts.isdigit() else 0}
