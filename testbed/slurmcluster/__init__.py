"""A Slurm cluster on this machine, from Debian's slurm-wlm and munge packages: munged, one
slurmctld and N slurmd nodes (Slurm's multiple-slurmd mode) on the loopback, or in the hosts of
a namespace cluster with shaped links (``netcluster=True``), each node with a hostname of its
own, everything under one temp dir; for running launch/slurm.sbatch as a user would, with
sbatch, squeue, scontrol and sacct -c. Needs root, unshare (util-linux).

    with SlurmCluster(nodes=2) as cluster:                  # up: every node idle
        job = slurm.sbatch(["-N", "2", "launch/slurm.sbatch", "--config", "configs/tiny.yaml"], cluster.env())
        jobs.wait(job, cluster.env(), ["COMPLETED"])
    # down: every process it started stopped by pid (the nodes' jobs too), the temp dir removed

    python -m testbed.slurmcluster run --nodes 2 -- 'sbatch --wait launch/slurm.sbatch ...; sacct -c'
    python -m testbed.slurmcluster run --nodes 2 --netcluster --rate 1gbit -- 'srun -N 2 hostname'

Modules: hosts.py (where the daemons run: loopback or namespace cluster), layout.py (paths,
ports, slurm.conf), daemons.py (starting munged, slurmctld, slurmd;
the nodes' processes), cluster.py (SlurmCluster: up, wait for idle, down), jobs.py (waiting on jobs,
scontrol, sacct -c for tests and scripts), cleanup.py (what a harness that died left), cli.py.
docs/SLURM.md says what was tested on it and what was not.
"""
from testbed.slurmcluster import jobs
from testbed.slurmcluster.cleanup import cleanup_leftovers
from testbed.slurmcluster.cluster import SlurmCluster
from testbed.slurmcluster.daemons import SlurmError, missing_programs
from testbed.slurmcluster.layout import PARTITION, URGENT

__all__ = ["PARTITION", "URGENT", "SlurmCluster", "SlurmError", "cleanup_leftovers", "jobs", "missing_programs"]
