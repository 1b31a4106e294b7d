"""``python -m testbed.netcluster``: the command line in cli.py."""
import sys

from testbed.netcluster.cli import main

sys.exit(main())
