"""The older spellings a config may hold, each read as its one spelling where a config is loaded:
in every layer (a resumed run's saved config, a ``--config`` file, the flags) and in a run
folder's config.yaml as the readers see it (hvd_cifar.runfolder.reader)::

    fp16_allreduce: true      compression: fp16 (beside another compression: refused)
    fp16_allreduce: false     dropped
    local_sgd_steps: N > 1    compression: local-sgd with local_sgd_steps: N, where the same layer
                              gives no compression or compression: none (beside another: refused)
    local_sgd_steps: 1        dropped beside any compression but local-sgd (it meant: no local SGD)

Each use the user spells (flags, YAML; not a resumed run's own saved config) is said once, one
warning line from rank 0 (``read``'s second part). A saved config.yaml holds local_sgd_steps only
under compression: local-sgd (``Config.given``), so reading it back never takes the key for the
old switch.
"""
from __future__ import annotations

from typing import Any

from hvd_cifar.core.errors import ConfigError

KINDS = {"fp16_allreduce": bool}  # the keys that are only aliases (no config key of that name), and their type
LOCAL_SGD = "local-sgd"           # the scheme local_sgd_steps's old spelling switched on


def _steps(layer: dict) -> int | None:
    steps = layer.get("local_sgd_steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def read(layer: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``layer`` (one layer's typed values) with its aliases read as their one spelling, and one
    line per alias it spells."""
    out, said = dict(layer), []
    fp16 = out.pop("fp16_allreduce", None)
    if fp16:
        if out.get("compression", "none") not in ("none", "fp16"):
            raise ConfigError(f"fp16_allreduce: true means compression: fp16, which conflicts with "
                              f"compression: {out['compression']}",
                              fixes=(["--no-fp16-allreduce"], ["--compression", "fp16"]))
        out["compression"] = "fp16"
        said.append("fp16_allreduce: true read as compression: fp16 (its one spelling)")
    elif fp16 is not None:
        said.append("fp16_allreduce: false dropped (compression alone says what goes on the wire)")
    steps = _steps(out)
    if steps is not None and steps > 1 and out.get("compression") != LOCAL_SGD:
        if out.get("compression", "none") != "none":
            raise ConfigError(f"local_sgd_steps: averages whole models every {steps} updates, not with "
                              f"compression: {out['compression']}",
                              fixes=(["--local-sgd-steps", "1"],
                                     ["--no-fp16-allreduce"] if fp16 else ["--compression", "none"]))
        out["compression"] = LOCAL_SGD
        said.append(f"local_sgd_steps: {steps} read as compression: {LOCAL_SGD} with local_sgd_steps: {steps} "
                    f"(its one spelling)")
    elif steps == 1 and out.get("compression") != LOCAL_SGD:
        del out["local_sgd_steps"]
        said.append(f"local_sgd_steps: 1 dropped (it meant no local SGD; local SGD is compression: {LOCAL_SGD})")
    return out, said
