"""TrainPipeline: runs a training loop's data one step ahead, so that the rows of batch
k+1 are pulled while batch k computes (TorchRec's TrainPipelineSparseDist, for the PS).

    ps_opt = PsOptimizer(model, dense=[dense], staleness=1)
    pipe = TrainPipeline(ps_opt, prefetch=lambda b: model.embedding.prefetch(b.features))
    for b in pipe.run(batches):          # b's rows are already on their way
        loss = loss_fn(model(b), b.labels)
        loss.backward()
        ps_opt.step()                    # pushes asynchronously (at most S steps in flight)
        ps_opt.zero_grad()
    # run() has flushed: every push of the loop is acknowledged (or its error raised)

``prefetch(batch)`` must call ``prefetch(...)`` of each PS module of the model with
exactly the input its forward will get for that batch (it is compared, and the pull is
made again if it differs). When the next batch is taken from the iterator, its pull is
started; it is issued once the pushes that step must see are acknowledged (staleness S of
the optimizer: see elastic_ps.torch_modules). ``enabled=False`` runs the same loop without
prefetching (each forward pulls), e.g. to measure what prefetching gains.

Not thread-safe: one training thread. A step that raises leaves the pipeline unusable;
call ``PsOptimizer.discard()`` before the next loop.
"""

import time

_END = object()


class TrainPipeline:
    """See the module docstring. ``optimizer``: the model's PsOptimizer."""

    def __init__(self, optimizer, prefetch, enabled=True):
        self.optimizer = optimizer
        self.prefetch = prefetch
        self.enabled = bool(enabled)
        # Taking batches from the iterator (reading, parsing): the wall clock, and the CPU
        # time of this (the training) thread alone. The wall clock also holds the time
        # other threads of the process (a client's calls in flight) took the core or the
        # GIL meanwhile: work of the pipeline, not of reading, so a training loop's figure
        # should subtract only read_thread_seconds.
        self.read_seconds = 0.0
        self.read_thread_seconds = 0.0

    def _next(self, it):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return next(it, _END)
        finally:
            self.read_seconds += time.perf_counter() - t0
            self.read_thread_seconds += time.thread_time() - c0

    def run(self, batches):
        """Yields the batches of ``batches`` in order, each one's rows prefetched while the
        previous one trained; after the last one, flushes the optimizer's pushes."""
        it = iter(batches)
        nxt = self._next(it)
        if nxt is not _END and self.enabled:
            self.prefetch(nxt)
        while nxt is not _END:
            cur, nxt = nxt, self._next(it)
            if nxt is not _END and self.enabled:
                self.prefetch(nxt)
            yield cur
        self.optimizer.flush()
