"""hvd_cifar: data-parallel CNN training with Horovod, measured.

The top level holds the commands, each only wiring the layers below together:

    train       python -m hvd_cifar.train       a training run (every rank)
    report      python -m hvd_cifar.report      a run's report, or a comparison of runs
    predict     python -m hvd_cifar.predict     a run predicted at other worker counts and networks
    probe       python -m hvd_cifar.probe       the network's latency and bandwidth, measured
    bench       python -m hvd_cifar.bench       a sweep: one training job per configuration
    horovodrun  python -m hvd_cifar.launch.horovodrun  horovodrun with the project's fixes and defaults

The layers, bottom up; each folder's docstring says what it may import (scripts/check_house.py
holds the package to it):

    core/       config, names, errors, files, byte formulas, units, process life (no torch)
    workload/   what is trained: data sets, models, optimizer and schedule, epoch sums
    compress/   communication reduction schemes (strategies the sync methods run)
    sync/       gradient synchronisation methods behind one interface (strategies the trainer uses)
    runfolder/  the run folder: write, read, lock, evaluation, TensorBoard
    trainer/    the step loop and everything around it: state, metrics, freezing, preemption,
                elastic, restore, exit statuses
    launch/     launcher command lines, hostfiles, the Slurm job's side, sweep runners
    analysis/   the scaling model, summaries, tables, plots, explain

The test bench (namespace cluster, Slurm cluster, fault drill) is the package ``testbed`` beside
this one: it imports hvd_cifar, and hvd_cifar never imports it.
"""
