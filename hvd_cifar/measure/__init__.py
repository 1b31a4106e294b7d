"""Measurements a user can trust: results files that keep every round, rounds run in rotated
order, comparisons paired within a round or by seed, 95 % confidence intervals (scipy.stats),
and verdicts that can say "unresolved". ``hvd_cifar.bench``, the report's comparisons, the
project's benchmarks and its rendered docs all go through here. A results file records the code
its jobs ran (their run folders' code.json, read through hvd_cifar.runfolder.code). No torch;
scipy only when an interval is computed.

May import: hvd_cifar.core, hvd_cifar.runfolder.code.
"""
