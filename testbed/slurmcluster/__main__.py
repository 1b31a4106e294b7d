import sys

from testbed.slurmcluster.cli import main

sys.exit(main())
