"""What a run is made of, in two parts: the ``Setup`` that hvd_cifar.train builds once per process
(config, sync method, device, data, model, freezing policy, grad scaler), and the ``Training``
that goes on from it epoch by epoch (the trainable set and its optimizer, the run folder's
writers, the ranks' shards and learning-rate schedule, the records). With them, what the epoch
loop does to them: autocast and backward, a new trainable set, the run's time, what a checkpoint
holds; and ``make_state``, the training state whose hooks the loop calls.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from hvd_cifar.core.config import Config
from hvd_cifar.runfolder import tensorboard, writer
from hvd_cifar.sync.base import SyncMethod
from hvd_cifar.trainer import loop
from hvd_cifar.trainer.freezing import AutoFreeze, ConfigFreezing
from hvd_cifar.workload import data, optim
from hvd_cifar.workload.epoch import SUMS, EpochContext, no_sums
from hvd_cifar.workload.models import set_frozen_blocks


@dataclass(frozen=True, slots=True)
class Setup:
    """What this process builds once (``train.build``) and the whole run reads. No field is
    reassigned; the objects change inside as they work (the model trains, the loader reshards
    when the ranks change, the freezing policy measures)."""
    cfg: Config                         # the run's config, compute's precision and layout settled
    sync: SyncMethod
    device: torch.device
    dataset: data.DataSet
    loader: data.ShardedLoader          # this rank's shard of the training set
    model: torch.nn.Module              # the plain model (checkpoints, freezing)
    identity: dict                      # what a checkpoint must match to be resumed here
    freezing: ConfigFreezing | AutoFreeze  # decides the frozen feature blocks per epoch
    scaler: torch.amp.GradScaler | None  # amp: fp16's loss scaling; None otherwise
    compute_choice: dict                # trainer.compute.decide's answer (meta.json)
    inert_keys: dict[str, str]          # keys given that do nothing here: {key: why} (meta.json)
    started: float                      # time.perf_counter() when this process began the run

    def autocast(self):
        use = self.cfg.amp != "none"
        dtype = torch.float16 if self.cfg.amp == "fp16" else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype, enabled=use)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def trainable_set(self, frozen_blocks: int, old_optimizer=None) -> TrainableSet:
        """Freeze the first ``frozen_blocks`` feature blocks and build the optimizer over the
        rest, wrapped by the sync method; momentum of parameters that stay trainable carries
        over from ``old_optimizer``."""
        set_frozen_blocks(self.model, frozen_blocks)
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        net, optimizer = self.sync.wrap(self.model, optim.sgd(named, optim.OptimSettings.of(self.cfg), old_optimizer),
                                        named, self.cfg.accumulation_steps)
        return TrainableSet(frozen_blocks, net, optimizer,
                            payload_bytes=self.sync.payload_bytes(named),
                            unfrozen_payload_bytes=self.sync.payload_bytes(list(self.model.named_parameters())),
                            param_count=sum(p.numel() for _, p in named))


@dataclass(frozen=True, slots=True)
class TrainableSet:
    """What trains while the first ``frozen_blocks`` feature blocks stay frozen, and its figures;
    made by Setup.trainable_set, replaced whole when the frozen set changes."""
    frozen_blocks: int
    net: torch.nn.Module                # the model as the sync method wrapped it
    optimizer: torch.optim.Optimizer    # over the trainable parameters, as the sync method wrapped it
    payload_bytes: int                  # gradient bytes per synchronisation
    unfrozen_payload_bytes: int         # ... were nothing frozen: what freezing saves is measured against it
    param_count: int                    # trainable parameters (the metrics line's trainable_params)


@dataclass(frozen=True, slots=True)
class Start:
    """Where this process's run starts: epoch 0, or where its checkpoint left off (--resume)."""
    epoch: int = 0                      # the first epoch to train (0-based)
    mid_epoch: dict | None = None       # a preempted run's place inside ``epoch``: the checkpoint's "position"
    record: dict | None = None          # the metrics line of the checkpoint's epoch, as the checkpoint holds it


@dataclass(slots=True, eq=False)
class Training:
    """The run on this rank as it goes on from ``setup``; each field says when it changes."""
    setup: Setup
    start: Start                        # set once, before the loop (restore.start_training)
    trainable: TrainableSet | None      # when the frozen set changes (set_trainable); None once the run ends
    run_dir: str = ""                   # at every begin: rank 0's run folder (elastic: learnt from the state)
    log: writer.RankLog | None = None   # at every begin: this rank's log, echoed by rank 0
    hostnames: tuple[str, ...] = ()     # at every begin: each rank's host (elastic: the ranks change)
    updates_per_epoch: int = 1          # at every begin (follow_ranks): a worker's optimizer updates an epoch
    schedule: optim.LrSchedule | None = None  # at every begin (follow_ranks): the learning rate per update
    elapsed_before: float = 0.0         # at the first begin: the run's wall time before a resume
    board: tensorboard.Board | None = None  # rank 0, tensorboard: true: opened at the first epoch recorded
    records: list[dict] = field(default_factory=list)  # rank 0, after every epoch: the run's epoch records so far

    @property
    def is_main(self) -> bool:
        return self.setup.sync.rank == 0

    def elapsed_s(self) -> float:
        """Wall time since the run started (training, evaluation and set-up; across resumes)."""
        return self.elapsed_before + time.perf_counter() - self.setup.started

    def set_trainable(self, frozen_blocks: int) -> None:
        """A new trainable set; momentum of parameters that stay trainable carries over."""
        self.trainable = self.setup.trainable_set(frozen_blocks, old_optimizer=self.trainable.optimizer)

    def follow_ranks(self) -> None:
        """The shards of the ranks that train now, and with them the updates per epoch and the
        learning rate (at every begin: elastic training changes the ranks)."""
        sync, cfg = self.setup.sync, self.setup.cfg
        self.setup.loader.reshard(sync.worker_rank, sync.workers)
        self.updates_per_epoch = math.ceil(len(self.setup.loader) / cfg.accumulation_steps)
        self.schedule = optim.LrSchedule(optim.OptimSettings.of(cfg), sync.size, self.updates_per_epoch)

    def epoch_context(self, epoch: int) -> EpochContext:
        """What the sync method's epoch is told of the run."""
        setup, optim_settings = self.setup, optim.OptimSettings.of(self.setup.cfg)
        return EpochContext(epoch, setup.cfg.epochs, self.run_dir, len(setup.loader), self.updates_per_epoch,
                            self.trainable.optimizer, setup.device, self.is_main and setup.cfg.progress,
                            lambda ranks, updates: optim.LrSchedule(optim_settings, ranks, updates))

    def rank_states(self) -> list[dict] | None:
        """Every rank's own state of the sync method (SyncMethod.rank_state), gathered for rank 0
        to save; None when the method keeps none. A collective: every rank calls it (each
        config's ranks all keep one or all keep none)."""
        own = self.setup.sync.rank_state()
        return None if own is None else self.setup.sync.allgather_object(own)

    def checkpointed(self, rank_states: list[dict] | None = None) -> dict:
        """What a checkpoint holds of the run besides where it stands (checkpoint.save_training);
        ``rank_states``: what rank_states() gathered."""
        setup = self.setup
        return {"identity": setup.identity, "cfg": setup.cfg, "model": setup.model,
                "optimizer": self.trainable.optimizer, "frozen_blocks": self.trainable.frozen_blocks,
                "freezing": setup.freezing, "scaler": setup.scaler, "rank_states": rank_states}


def make_state(run: Training, run_dir: str):
    """The training state the loop keeps and whose hooks it calls, at ``run.start``: a
    loop.TrainingState; under elastic Horovod, the state Horovod commits and restores."""
    sync, start = run.setup.sync, run.start
    place = start.mid_epoch or {"step": 0, "position": 0, "totals": no_sums()}
    # A checkpoint from before top-5 was counted holds fewer sums: that epoch's top-5 is unknown.
    totals = [*place["totals"], *[math.nan] * (len(SUMS) - len(place["totals"]))]
    where = dict(run_dir=run_dir, epoch=start.epoch, step=place["step"], position=place["position"], totals=totals)
    if not sync.elastic:
        return loop.TrainingState(sync, run.setup.model, run.trainable.optimizer, **where)
    # Imported only here: elastic.py loads Horovod, which a run under another method never starts.
    from hvd_cifar.trainer.elastic import ElasticState
    return ElasticState(sync, run.setup.model, run.trainable.optimizer, commit_every=run.setup.cfg.commit_every,
                        **where)
