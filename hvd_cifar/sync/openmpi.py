"""Open MPI settings hvd_cifar asks for wherever a sync method starts MPI (Horovod over MPI,
mpi4py's methods, DDP's rendezvous under mpirun). Set in the environment before MPI
initialises; a value the launcher gave (-mca / -x) still wins."""
from __future__ import annotations

import os

# Open MPI allreduce algorithm choice by message size (coll_tuned's dynamic rules format).
ALLREDUCE_RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openmpi_allreduce.rules")


def apply_defaults() -> None:
    # Open MPI busy-polls while a rank waits in a call unless it knows the node is
    # oversubscribed. Horovod's background thread sits in such calls between tensors, so with
    # as many ranks as cores the polling takes the cores the training threads need (measured:
    # Horovod's step 1.33x DDP's at np=2 on 2 cores; 0.95x with yielding).
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    # Open MPI's fixed rules pick, for a few ranks and tens of MB, an allreduce that ran at
    # about 0.55 Gbit/s of payload on 1 Gbit/s links (4 hosts, vgg11's 36.9 MB); its ring
    # reaches about 0.85. The rules file keeps the fixed decision below 1 MiB, where latency
    # matters (Horovod's per-cycle negotiation, metric sums), and asks for the ring
    # (algorithm 4) from 1 MiB up, for any number of ranks.
    os.environ.setdefault("OMPI_MCA_coll_tuned_use_dynamic_rules", "1")
    os.environ.setdefault("OMPI_MCA_coll_tuned_dynamic_rules_filename", ALLREDUCE_RULES)
