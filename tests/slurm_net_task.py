"""One task of tests/test_slurm_netcluster.py, started on each node by ``srun --mpi=pmix``: it
says where it runs (hostname, the address that hostname has, Slurm's node name), then
allreduces NBYTES with the other tasks, timed, and prints it all as one JSON line.

    srun -N 2 --ntasks-per-node=1 --mpi=pmix python tests/slurm_net_task.py NBYTES
"""
import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
values = np.full(int(sys.argv[1]) // 8, comm.rank + 1, dtype=np.float64)  # NBYTES of float64
total = np.empty_like(values)
comm.Barrier()
start = time.perf_counter()
comm.Allreduce(values, total)
seconds = time.perf_counter() - start
host = socket.gethostname()
print(json.dumps({"rank": comm.rank, "size": comm.size, "hostname": host, "addr": socket.gethostbyname(host),
                  "node": os.environ["SLURMD_NODENAME"], "seconds": seconds,
                  "sum_ok": bool((total == comm.size * (comm.size + 1) / 2).all())}), flush=True)
