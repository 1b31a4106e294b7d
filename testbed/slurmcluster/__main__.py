import sys

from hvd_cifar.slurmcluster.cli import main

sys.exit(main())
