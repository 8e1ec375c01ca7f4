"""Pipeline parallelism: the layers cut into p stages, the batch into m micro-batches.

Each stage runs forward and backward of every micro-batch in the order its schedule
says, passing activations forward and gradients back by send/recv. While the pipe
fills and drains, stages wait: the bubble, idle time over ideal compute time,

    GPipe, 1F1B   (p - 1) / m          interleaved (v chunks per rank)   (p - 1) / (v m)
    ZB-H1         (p - 1) / (3 m)      ZB-H2, ZB-V   0     (backward split into B and W,
                                                           T_F = T_B = T_W)
    DualPipeV     (p - 1)(F&B + B - 3W) of idle, a forward and a backward as one op

Files, in reading order:

- op.py        an op (F, B, W), where the pieces sit on the ranks, what an op costs
- schedule.py  schedules as plain data (GPipe, 1F1B, interleaved), a simulator that
               checks them, and ASCII timelines
- zero_bubble.py  ZB-H1, ZB-H2, ZB-V: B and W as separate ops, W moved into the bubble
- dualpipe.py  DualPipeV: zb_v's V, its steady state one F&B op (op.Overlap) pairing a
               forward of one chunk with a backward of the other
- executor.py  ``run_pipeline``: a schedule run in real processes, receive -> run ->
               send per op; the measured bubble
- clock.py     the timeline of a run: measured, padded to op costs, or a logical clock
- gpt.py       the small GPT cut into pipeline pieces, tied embeddings kept in sync

Docs: docs/pipeline.md. Demos: demos/07_pipeline.py, demos/17_zero_bubble.py. Tests: tests/parallel/pipeline/.
"""
from minidist.parallel.pipeline.dualpipe import dualpipe_v
from minidist.parallel.pipeline.executor import (PipelineStats, measured_bubble, run_pipeline,
                                                 split_layers)
from minidist.parallel.pipeline.gpt import (GPTPiece, counted_parameters, pieces_of_rank,
                                            pipeline_parameters, split_gpt,
                                            sync_tied_gradients)
from minidist.parallel.pipeline.op import Overlap
from minidist.parallel.pipeline.schedule import (Op, chunks_per_rank, gpipe, interleaved,
                                                 make_schedule, one_f_one_b, placement,
                                                 render_timeline, simulate)
from minidist.parallel.pipeline.zero_bubble import zb_h1, zb_h2, zb_v

__all__ = ["Op", "Overlap", "dualpipe_v", "gpipe", "one_f_one_b", "interleaved", "zb_h1", "zb_h2", "zb_v",
           "make_schedule", "chunks_per_rank", "placement", "simulate",
           "render_timeline", "run_pipeline", "PipelineStats", "measured_bubble", "split_layers",
           "GPTPiece", "split_gpt", "pieces_of_rank", "pipeline_parameters",
           "sync_tied_gradients", "counted_parameters"]
