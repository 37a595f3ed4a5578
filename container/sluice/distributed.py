"""Multi-GPU and multi-instance training: torchrun launch from SageMaker's resourceconfig, ranks."""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .paths import OptML

log = logging.getLogger("sluice.distributed")

MASTER_PORT = 7777  # the port SageMaker's PyTorch toolkit uses


@dataclass
class Ranks:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls) -> Ranks:
        return cls(
            int(os.environ.get("RANK", 0)),
            int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def device(self) -> torch.device:
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def init(self) -> None:
        if self.distributed and not dist.is_initialized():
            # long enough for rank 0's final evaluation and export while the others wait
            dist.init_process_group(
                "nccl" if torch.cuda.is_available() else "gloo", timeout=timedelta(hours=2)
            )

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when any rank's flag is set (so all stop at the same step)."""
        if not self.distributed:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def mean(self, value: float) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([value], device=self.device(), dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / self.world_size

    def close(self) -> None:
        """Destroy the process group. Callers drop their DDP wrapper first: its reducer holds the
        group and, freed after it, would free it last, with the GIL held, joining gloo threads
        that need the GIL to free finished collectives' tensors (a hang at exit, ~1 run in 12
        on two busy cores). Freed while the group is still registered, the reducer frees nothing
        of it, and destroy_process_group's release of the group lets go of the GIL."""
        if dist.is_initialized():
            gc.collect()  # a DDP wrapper caught in a reference cycle goes now, not later
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_args(opt: OptML, nproc: int | None) -> list[str] | None:
    """torchrun's arguments when this job needs several processes, else None.

    On SageMaker the hosts come from resourceconfig.json: sorted, the first is the master, the node
    rank is the current host's index. One process per GPU unless `nproc` says otherwise.
    """
    if "LOCAL_RANK" in os.environ:  # already a torchrun worker
        return None
    rc = opt.resourceconfig()
    hosts = sorted(rc["hosts"]) if rc else []
    nproc = nproc or max(torch.cuda.device_count(), 1)
    if len(hosts) <= 1 and nproc == 1:
        return None
    if len(hosts) > 1:
        if rc.get("network_interface_name"):
            os.environ.setdefault("NCCL_SOCKET_IFNAME", rc["network_interface_name"])
        return [
            f"--nnodes={len(hosts)}",
            f"--nproc_per_node={nproc}",
            f"--node_rank={hosts.index(rc['current_host'])}",
            f"--master_addr={hosts[0]}",
            f"--master_port={MASTER_PORT}",
        ]
    return [
        "--nnodes=1",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
    ]


def _worker_argv(argv: list[str]) -> list[str]:
    """The command line for each worker, less --nproc (torchrun's parser takes it for its own)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def run_torchrun(args: list[str], argv: list[str]) -> int:
    """Run torchrun's launcher in this process with the same command for each worker; returns
    the job's exit status. SIGTERM (StopTrainingJob, spot) reaches the launcher, which passes it
    to the workers (each saves its checkpoint): 128 + the signal, as a single process exits, not
    torchrun's traceback and 1. A failed worker: 1, its failure file says why."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    worker = ["-m", "sluice.cli", *_worker_argv(argv)]
    print("launching: torchrun " + " ".join([*args, *worker]), flush=True)
    try:
        run(get_args_parser().parse_args([*args, *worker]))
    except SignalException as e:
        log.warning("stopped by %s: the workers saved their checkpoint", e.sigval.name)
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        return _job_status(sorted({f.exitcode for f in e.failures.values()}))
    return 0


def _job_status(codes: list[int]) -> int:
    """The job's exit status from its failed workers' statuses. A worker that stopped for SIGTERM
    (143, its checkpoint written with the others') makes torchrun SIGTERM the rest, and one still
    closing down dies of it (-15): that is a stopped job too, not a failed one."""
    stopped = 128 + int(signal.SIGTERM)
    if stopped in codes and set(codes) <= {stopped, -int(signal.SIGTERM)}:
        return stopped
    log.error("training failed in worker(s) with exit status %s", codes)
    return 1
