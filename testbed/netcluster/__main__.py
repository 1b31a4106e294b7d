"""``python -m hvd_cifar.netcluster``: the command line in cli.py."""
import sys

from hvd_cifar.netcluster.cli import main

sys.exit(main())
