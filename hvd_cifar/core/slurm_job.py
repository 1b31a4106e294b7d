"""What a Slurm job's environment says about the run that trains in it, recorded in one shape
wherever a run notes it: meta.json (``writer.run_metadata``) and each ``preempted`` line of
events.jsonl (``preemption.Preempted.event``). Outside Slurm (no SLURM_JOB_ID) nothing.

    {"slurm_job_id": "42", "slurm_nodes": "n[1-2]", "slurm_restart_count": 1}

``slurm_restart_count`` is Slurm's SLURM_RESTART_COUNT: 0 on a job's first run, then one more
each time it is requeued (by ``scontrol requeue``, a preemption, or launch/slurm.sbatch itself).
"""
from __future__ import annotations

import os
from typing import Mapping


def facts(env: Mapping[str, str] | None = None) -> dict:
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        return {}
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    return {"slurm_job_id": job, "slurm_nodes": env.get("SLURM_JOB_NODELIST", ""),
            "slurm_restart_count": int(restarts) if restarts.isdigit() else 0}
