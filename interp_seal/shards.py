"""Splitting a long run over the processes of ``torchrun``: each rank does every N-th unit.

A sweep or a score over many heads, records or conditions is a list of independent units of
work. Under ``torchrun --nproc_per_node N -m interp_seal.cli <command> ...`` every process
runs the same command on the same inputs; ``start_process_group`` joins them (gloo on CPU,
nccl on CUDA) and ``Shard.current()`` tells each one its ``rank`` of ``world``. Unit ``i``
belongs to rank ``i % world`` (``owns``): neighbouring units (heads of one layer, records of
one length) cost about the same, so interleaving balances the ranks without measuring.

Each rank appends its finished units to its own record file (``interp_seal.records``: a killed
rank loses only its unit in flight, ``--resume`` continues every shard), and ``gather`` hands
every rank all ranks' results at the end, so the result table is the same on every rank and
equal to a one-process run; rank 0 (``main``) writes the outputs. Without torchrun the shard is
``Shard(0, 1)``: everything is one process's, and nothing here calls ``torch.distributed``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

# torch is imported where a process group is used, so that importing this module (the command
# line builds its parser with it) stays cheap; without torch loaded there is no process group.


@dataclass(frozen=True)
class Shard:
    """This process's place in the run: ``rank`` of ``world`` processes."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Shard:
        """The running process group's shard, or the whole run when there is none."""
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes a run's outputs."""
        return self.rank == 0

    def owns(self, index: int) -> bool:
        """Whether unit ``index`` of a run is this rank's work."""
        return index % self.world == self.rank

    def barrier(self) -> None:
        """Wait until every rank got here."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def gather(self, items: list) -> list:
        """Every rank's ``items``, concatenated in rank order; the same list on every rank."""
        if self.world == 1:
            return list(items)
        import torch.distributed as dist

        parts: list = [None] * self.world
        dist.all_gather_object(parts, list(items))
        return [item for part in parts for item in part]


def launched_by_torchrun() -> bool:
    """Whether this process is one of several started by ``torchrun`` (``WORLD_SIZE > 1``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def start_process_group(device) -> Shard:
    """Join the ranks started by torchrun: nccl when the model runs on CUDA (a
    ``torch.device``), gloo otherwise.

    Each CUDA rank takes the GPU of its ``LOCAL_RANK``. Returns this process's shard.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return Shard.current()
