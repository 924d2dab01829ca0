"""Rows moved on the workers: a sample drawn where each chunk lives (``Engine.sample``, a coreset) and the
rows of ``Engine.reorder`` sent worker to worker; the driver handles counts and futures, never rows."""

import numpy as np

from ..kernels.assign import stacked
from .chunk import Chunk, routed_rows
from .data import FutureSource, row_starts
from .events import count
from .partition import home
from .placement import GONE
from .recovery import WorkerLost


def draw_chunk(data, meta, step, params):
    """``step`` on one chunk as a one-shot task: (rows, weights) it draws."""
    index, start, stop, entropy = meta
    return Chunk(index, start, stop, data, entropy).run(step, params)


def sorted_routed(chunk, plan):
    """The chunk's rows with their new positions, sorted by position."""
    pos, x, w, ids = routed_rows(chunk, plan)
    order = np.argsort(pos)
    return pos[order], x[order], w[order], ids[order]


def rows_at(routed, a, b):
    """The routed rows whose new position is in [a, b)."""
    lo, hi = np.searchsorted(routed[0], [a, b])
    return tuple(f[lo:hi] for f in routed)


def place(*parts):
    """One new chunk from its routed rows: (x, w, input ids) in position order."""
    pos, x, w, ids = (stacked([p[i] for p in parts]) for i in range(4))  # (CSR rows stacked as CSR)
    order = np.argsort(pos)
    return x[order], w[order], ids[order]


def rows_of(piece, lo, hi):
    return piece[0][lo:hi], piece[1][lo:hi]


def stack(*pieces):
    return stacked([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])


class RowMoves:
    """Rows drawn or reordered where the partitions of ``placement`` (a ``placement.Placement``) hold them,
    moved worker to worker: the driver handles counts and futures."""

    def __init__(self, placement):
        self.placement = placement
        self.source, self.client = placement.source, placement.client

    def _one_shot(self, c, fn, *args):
        """(worker, future of ``draw_chunk`` running ``fn`` on chunk c) where c's rows live: rows a lost
        worker took (scattered, so Dask cannot recompute them) are loaded again first."""
        placement = self.placement
        for pid, (addr, ids) in enumerate(placement.where):
            if c in ids:
                break
        if not placement.streaming and any(getattr(f, "status", None) in GONE for f in placement.data[pid]):
            live = self._homes([pid])
            addr = addr if addr in live else live[0]
            placement.data[pid] = placement.load(ids, addr)  # the partition itself is rebuilt by its next call
        meta = (c, int(self.source.starts[c]), int(self.source.starts[c + 1]), placement.entropy)
        return addr, self._near(addr, draw_chunk, placement.data[pid][ids.index(c)], meta, fn, *args)

    def _homes(self, pids):
        """The sorted live addresses rows are moved to: every worker can be lost between a partition's rebuild
        choosing a worker and its rows being drawn again, so this waits for one to come back, as the rebuild
        does."""
        scheduler = self.placement.scheduler
        live = sorted(scheduler.live_workers() or scheduler.await_worker())
        if not live:
            raise WorkerLost(pids, "the cluster has no worker left to move rows to")
        return live

    def drawn(self, step, params, counts, chunk_rows):
        """A ``FutureSource`` of the rows ``step`` draws, chunk c drawing counts[c]: one task per chunk where
        its rows live, then the draws sliced and stacked into chunks of ``chunk_rows`` on the workers the
        new engine will place them on (Dask moves the slices worker to worker). Its chunks can be drawn
        again, each from the chunks that feed it (``FutureSource.remake``)."""
        ends = np.cumsum(counts)
        begins = ends - counts
        starts = row_starts(int(ends[-1]), chunk_rows)
        n_new = len(starts) - 1

        def make(new_ids):
            pieces, futures = {}, []
            addrs = self._homes(range(len(self.placement.where)))
            for j in new_ids:
                a, b = starts[j], starts[j + 1]
                parts = []
                for c in range(int(np.searchsorted(ends, a, side="right")), int(np.searchsorted(begins, b))):
                    if not counts[c]:
                        continue
                    if c not in pieces:
                        pieces[c] = self._one_shot(c, step, params)
                    lo, hi = max(a, begins[c]) - begins[c], min(b, ends[c]) - begins[c]
                    addr, fut = pieces[c]
                    whole = lo == 0 and hi == counts[c]
                    parts.append(fut if whole else self._near(addr, rows_of, fut, lo, hi))
                futures.append(self._near(addrs[home(j, n_new, len(addrs))], stack, *parts))
            return futures

        count("drawn", rows=int(ends[-1]))
        return FutureSource(make(range(n_new)), starts, self.source.n_features, self.source.dtype, make, self.source)

    def _near(self, addr, fn, *args):
        """A one-shot task placed on ``addr`` that Dask may run, or run again after a loss, elsewhere."""
        return self.client.submit(fn, *args, workers=[addr], allow_other_workers=True, pure=False)

    def reordered(self, plan, counts, first, chunks):
        """A ``FutureSource`` of the rows in ``reorder``'s order, in chunks of this source's sizes: one task
        per chunk where its rows live gives each row its position (``route``), then every new chunk gathers
        its rows from the chunks that feed it, on the worker the new engine will place it on."""
        starts = self.source.starts
        n_new = len(starts) - 1
        feeds = [set() for _ in range(n_new)]  # new chunk -> the old chunks holding some of its rows
        lo = np.searchsorted(starts, first, side="right") - 1
        hi = np.searchsorted(starts, first + counts - 1, side="right") - 1
        for c, a, b in zip(chunks, lo, hi):
            for j in range(a, b + 1):
                feeds[j].add(int(c))

        def make(new_ids):
            routed, futures = {}, []
            addrs = self._homes(range(len(self.placement.where)))
            for j in new_ids:
                for c in feeds[j] - set(routed):
                    routed[c] = self._one_shot(c, sorted_routed, plan)
                parts = [
                    self._near(routed[c][0], rows_at, routed[c][1], starts[j], starts[j + 1]) for c in sorted(feeds[j])
                ]
                futures.append(self._near(addrs[home(j, n_new, len(addrs))], place, *parts))
            return futures

        return FutureSource(make(range(n_new)), starts, self.source.n_features, self.source.dtype, make, self.source)
