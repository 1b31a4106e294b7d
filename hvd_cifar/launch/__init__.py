"""Starting jobs: every horovodrun and mpirun command line (commands.py), horovodrun ending in one
line (horovodrun.py), hostfiles, the Slurm
job's side (slurm_resume.py, slurm_output.py, the client commands in slurm.py), and the sweep's
runners. The shell scripts in the repository's launch/ folder call these.

May import: hvd_cifar.core, hvd_cifar.runfolder.
"""
