"""What a run is made of: the ``Training`` that ``hvd_cifar.train`` builds once per process and the
epoch loop, ``loop.train_one_epoch`` and ``loop.evaluate`` read (the config, the sync method,
data, model, optimizer and the run folder's writers), with the few things done to it: setting
the trainable parameters (and with them the optimizer), autocast and backward, the run's time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from hvd_cifar.core.config import Config
from hvd_cifar.runfolder import writer, tensorboard
from hvd_cifar.sync.base import SyncMethod
from hvd_cifar.trainer import loop
from hvd_cifar.trainer.freezing import AutoFreeze, ConfigFreezing
from hvd_cifar.workload import data, optim
from hvd_cifar.workload.models import set_frozen_blocks


@dataclass
class Training:
    """Everything the epoch loop and loop.train_one_epoch use, built once by ``train.build``."""
    cfg: Config
    sync: SyncMethod
    device: torch.device
    dataset: data.DataSet
    loader: data.ShardedLoader
    model: torch.nn.Module              # the plain model (checkpoints, freezing)
    identity: dict                      # what a checkpoint must match to be resumed here
    freezing: ConfigFreezing | AutoFreeze  # decides ``frozen`` per epoch
    start_epoch: int = 0
    resume_at: dict | None = None       # a preempted run's place inside start_epoch (checkpoint's "position")
    resume_record: dict | None = None   # the metrics line of the checkpoint's epoch, as the checkpoint holds it
    net: torch.nn.Module = None         # the model as the sync method wrapped it
    optimizer: torch.optim.Optimizer = None
    payload_bytes: int = 0              # gradient bytes per synchronisation
    unfrozen_payload_bytes: int = 0     # ... were nothing frozen: what freezing saves is measured against it
    trainable: int = 0
    frozen: int = 0
    scaler: torch.amp.GradScaler | None = None
    run_dir: str = ""
    log: writer.RankLog | None = None
    board: tensorboard.Board | None = None   # rank 0, tensorboard: true: opened at the first epoch recorded
    hostnames: tuple = ()
    schedule: optim.LrSchedule | None = None
    updates_per_epoch: int = 1
    started: float = 0.0                # time.perf_counter() when this process began the run
    elapsed_before: float = 0.0         # wall time of the run before a resume
    records: list[dict] = field(default_factory=list)  # rank 0: the run's epoch records so far, as recorded
    inert_keys: dict = field(default_factory=dict)  # keys given that do nothing here: {key: why} (meta.json)
    compute_choice: dict = field(default_factory=dict)  # trainer.compute.decide's answer (meta.json)

    def elapsed_s(self) -> float:
        """Wall time since the run started (training, evaluation and set-up; across resumes)."""
        return self.elapsed_before + time.perf_counter() - self.started

    @property
    def is_main(self) -> bool:
        return self.sync.rank == 0

    def autocast(self):
        use = self.cfg.amp != "none"
        dtype = torch.float16 if self.cfg.amp == "fp16" else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype, enabled=use)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def set_trainable(self, frozen: int, old_optimizer=None) -> None:
        """Freeze the first ``frozen`` feature blocks and (re)build the optimizer over the rest,
        wrapped by the sync method; momentum of parameters that stay trainable carries over."""
        self.frozen = frozen
        set_frozen_blocks(self.model, frozen)
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        cfg = self.cfg
        self.net, self.optimizer = self.sync.wrap(self.model, optim.sgd(named, optim.OptimSettings.of(cfg), old_optimizer), named,
                                                  cfg.accumulation_steps)
        self.payload_bytes = self.sync.payload_bytes(named)
        self.unfrozen_payload_bytes = self.sync.payload_bytes(list(self.model.named_parameters()))
        self.trainable = sum(p.numel() for _, p in named)

    def rank_states(self) -> list[dict] | None:
        """Every rank's own state of the sync method (SyncMethod.rank_state), gathered for rank 0
        to save; None when the method keeps none. A collective: every rank calls it (each
        config's ranks all keep one or all keep none)."""
        own = self.sync.rank_state()
        return None if own is None else self.sync.allgather_object(own)

    def checkpointed(self, rank_states: list[dict] | None = None) -> dict:
        """What a checkpoint holds of the run besides where it stands (checkpoint.save_training);
        ``rank_states``: what rank_states() gathered."""
        return {"identity": self.identity, "cfg": self.cfg, "model": self.model, "optimizer": self.optimizer,
                "frozen_blocks": self.frozen, "freezing": self.freezing, "scaler": self.scaler,
                "rank_states": rank_states}


def make_state(sync: SyncMethod, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **values):
    """The training state the loop keeps and whose hooks it calls: the model, the optimizer and
    ``values`` as attributes; under elastic Horovod, the state Horovod commits and restores."""
    if not sync.elastic:
        return loop.TrainingState(sync, model=model, optimizer=optimizer, **values)
    # Imported only here: elastic.py loads Horovod, which a run under another method never starts.
    from hvd_cifar.trainer.elastic import ElasticState
    return ElasticState(sync, model=model, optimizer=optimizer, **values)
