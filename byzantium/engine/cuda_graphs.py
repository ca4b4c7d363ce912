"""CUDA graphs for decode steps: a step of B single-token rows replays a graph captured at the smallest
bucket >= B (1, 2, 4, ..., 256, up to max_num_seqs), as nano-vllm and vLLM do, instead of launching
each layer's kernels from Python (a small model's decode step is launch-bound: ~10 launches a layer).

A graph replays fixed kernels on fixed addresses, so everything a decode step reads must sit at the
same place with the same shape at every replay:
- the step's integers are in the runner's StepBuffers, whose layout for B padded rows depends only on B;
  padding rows have slot -1 (store_kv skips them) and length 0 (decode attention gives zeros), and the
  runner reads logits only for the real rows;
- block tables are max_blocks wide (max_model_len / block_size) whatever this step's contexts;
- the Triton decode kernel's split count (its launch grid) is fixed per bucket from max_model_len
  (FixedSplits), not from this step's contexts.
Only steps of single-token rows replay (decodes; a one-token prefill chunk is the same computation and
takes the decode kernel in eager steps too). Prefill and mixed steps, and batches above the largest
bucket, run eagerly.

Graphs are captured lazily, the first time a bucket is used: one eager run (Triton compiles, cuBLAS
sets up) then the capture, on one side stream, into one memory pool shared by all buckets (safe: they
never run concurrently, and each graph's output is read before the next replay). The capture records
the real step, so its K/V writes are simply done again at replay. If a capture fails (some op in the
model syncs with the host, for example), graphs are turned off for this engine and the step runs eagerly.
"""
import logging

import torch

logger = logging.getLogger("byzantium")

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def buckets_for(max_num_seqs):
    return tuple(b for b in BUCKETS if b <= max_num_seqs)


def bucket_for(num_rows, buckets):
    """The smallest bucket that holds num_rows rows, or None."""
    return next((b for b in buckets if b >= num_rows), None)


class FixedSplits:
    """meta.ops of every staged (CUDA) step, graphed or eager: the attention backend, with
    paged_decode_attention's split count (its launch grid) chosen from the rows' bucket and max_model_len,
    explicitly: never from what a step holds, so every replay's grid is the captured one, an eager step
    sums in the same splits as a graphed one of its bucket (the same results in both modes), and no new
    split count compiles mid-serving."""

    def __init__(self, ops, max_model_len):
        self.ops, self.max_model_len = ops, max_model_len
        # Without the chooser (another backend) the call passes through: the tables a graphed step hands
        # over are max_blocks wide, so a choice from shapes is the same at every replay anyway.
        self.choose = getattr(ops, "_decode_num_splits", None) if ops.__name__.endswith("triton_ops") else None

    def __getattr__(self, name):  # store_kv, append_prefill_attention, __name__: the backend's own
        if name == "ops":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.ops, name)

    def paged_decode_attention(self, q, k_cache, v_cache, seq_lens, block_tables, scale, window=None, **chunk):
        if self.choose is None:
            return self.ops.paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale, window, **chunk)
        context = min(self.max_model_len, window or self.max_model_len, chunk.get("chunk") or self.max_model_len)
        rows = bucket_for(q.shape[0], BUCKETS) or q.shape[0]  # an eager step of 3 rows: as its graph of 4
        splits = self.choose(rows, k_cache.shape[2], context, q.device)
        return self.ops.paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale, window,
                                               num_splits=splits, **chunk)


class CaptureFailed(RuntimeError):
    pass


def record(forward, pool, stream):
    """Warm forward() up on `stream`, then capture it there into a CUDA graph; (graph, the output the
    graph fills at each replay). The warm-up's errors are the step's own (out of memory...) and pass
    through; a failed capture raises CaptureFailed. thread_local: another engine's thread may use the
    GPU meanwhile; only this thread must not sync while capturing."""
    with torch.cuda.device(stream.device):
        current = torch.cuda.current_stream()
        stream.wait_stream(current)  # the step's inputs were copied on the current stream
        with torch.cuda.stream(stream):
            forward()  # compiles the Triton kernels, sets up cuBLAS; writes the same K/V as the replay will
        current.wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                output = forward()
        except Exception as error:
            raise CaptureFailed(f"{type(error).__name__}: {str(error)[:200]}") from error
    return graph, output


class DecodeGraphs:
    def __init__(self, max_num_seqs, max_blocks, device):
        self.buckets = buckets_for(max_num_seqs)
        self.max_blocks, self.device = max_blocks, device
        self.graphs = {}  # bucket -> (graph, output, addresses of its inputs)
        self.pool = None  # the memory pool all captures share
        self.stream = None  # the side stream of warm-ups and captures
        self.off_reason = None  # set when a capture failed: graphs stay off

    def bucket(self, rows):
        """The bucket a step of `rows` replays, or None (run it eagerly)."""
        if self.off_reason is not None or any(r.num_tokens != 1 for r in rows):
            return None
        if any(len(r.seq.block_table) > self.max_blocks for r in rows):
            return None
        return bucket_for(len(rows), self.buckets)

    def run(self, bucket, forward, addresses):
        """forward()'s output for this step: the bucket's graph replayed (captured first if new), or an
        eager run when capturing fails. `addresses` (the inputs' data pointers) must be the ones the
        graph was captured with: a layout bug would otherwise silently read stale inputs."""
        entry = self.graphs.get(bucket)
        if entry is None:
            entry = self._capture(bucket, forward, addresses)
            if entry is None:
                return forward()
        graph, output, captured = entry
        if captured != addresses:
            raise RuntimeError(f"CUDA graph of bucket {bucket}: its inputs moved ({captured} -> {addresses})")
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):  # replay launches on the current device's stream
                graph.replay()
        else:  # tests' stand-in
            graph.replay()
        return output

    def _capture(self, bucket, forward, addresses):
        if self.stream is None and self.device.type == "cuda":
            self.stream = torch.cuda.Stream(self.device)
        try:
            graph, output = record(forward, self.pool, self.stream)
        except CaptureFailed as error:
            self.off_reason = f"capturing bucket {bucket} failed: {error}"
            logger.warning("byzantium: CUDA graphs turned off for this engine (%s); decode runs eagerly",
                           self.off_reason)
            return None
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bucket] = (graph, output, addresses)
        return self.graphs[bucket]

    def describe(self):
        return {"enabled": self.off_reason is None, "buckets": list(self.buckets),
                "captured": sorted(self.graphs), **({"off_reason": self.off_reason} if self.off_reason else {})}
