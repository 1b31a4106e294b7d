"""The test bench, beside the product: a cluster of network namespaces with shaped links
(netcluster/), a Slurm cluster on this machine (slurmcluster/), the fault drill (drill.py) and
the benchmarks' job helpers (jobs.py). It imports hvd_cifar; hvd_cifar never imports it.

    python -m testbed.netcluster run --hosts 2 -- ...
    python -m testbed.slurmcluster run --nodes 2 -- ...
"""
