"""Several processes on one forward (docs/sequence_parallel.md): the CFG-parallel halves of a
process group, each splitting the rows of the batch elements it runs over its own group."""

from __future__ import annotations

from typing import Any

import torch


def group_size(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


class CfgParallel:
    """CFG-parallel ranks: the process group's ranks in two halves, each with a group of its own
    that splits the rows of the batch elements it runs; a call of two batch elements of one
    geometry (the conditional and the unconditional) runs one element on each half, and the
    halves trade their outputs."""

    def __init__(self, group: Any) -> None:
        import torch.distributed as dist

        if group is None:
            raise ValueError("cfg_parallel: needs a process_group")
        self._dist, self._world = dist, group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if size % 2:
            raise ValueError(f"cfg_parallel: the process group's {size} ranks do not make two halves")
        self.half = size // 2
        ranks = [dist.get_global_rank(group, r) for r in range(size)]
        # Every rank creates both groups, in the same order (torch.distributed.new_group).
        halves = [dist.new_group(ranks[:self.half]), dist.new_group(ranks[self.half:])]
        self.side = rank // self.half
        self.group = halves[self.side]
        self._leaders = [ranks[0], ranks[self.half]]

    def shares(self, inputs: list[dict[str, torch.Tensor]]) -> int | None:
        """The batch element this half runs, or None where the call does not split (not two
        elements of one geometry: every rank runs every element)."""
        if len(inputs) != 2:
            return None
        a, b = inputs
        same = a.keys() == b.keys() and all(
            not isinstance(a[k], torch.Tensor) or (a[k].shape == b[k].shape and a[k].dtype == b[k].dtype) for k in a)
        return self.side if same else None

    def exchange(self, outputs: list[Any], mine: int) -> list[Any]:
        """Both elements' outputs on every rank: each half's leader sends its element's."""
        own = outputs[mine]  # made contiguous: NCCL sends only those
        own = {k: v.contiguous() for k, v in own.items()} if isinstance(own, dict) else own.contiguous()
        done = []
        for e in range(2):
            out = own if e == mine else (
                {k: torch.empty_like(v) for k, v in own.items()} if isinstance(own, dict) else torch.empty_like(own))
            for t in (out.values() if isinstance(out, dict) else [out]):
                self._dist.broadcast(t, src=self._leaders[e], group=self._world)
            done.append(out)
        return done

    def text(self) -> str:
        return (f"cfg parallel: two batch elements of one geometry on two halves of {self.half} rank(s); "
                f"this rank is in half {self.side}")
