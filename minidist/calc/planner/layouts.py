"""The space the planner searches: every layout, and the rules that exclude one.

A layout is dp x tp x pp x cp = GPUs (ep borrows its ranks from dp x cp, as
torchtitan's expert parallelism does), a ZeRO stage (3 is FSDP), a micro-batch
size, a recomputation policy and a pipeline schedule. The mesh is laid out tp
innermost (inside a node, on NVLink), then cp, then dp, then pp outermost.

The divisibility rules, each with the reason it excludes a layout:

    tp    divides the heads and the KV heads, and fits in a node (tp <= GPUs per node)
    pp    <= L, and divides L, or L + 2 (the first and last stages one layer short,
          making room for the embedding and the output layer, as Llama 3 405B's 126
          layers on 16 stages); interleaved: v chunks per stage, p v divides L or L + 2,
          and p divides m (Megatron's interleaved schedule)
    cp    2 cp divides s (zigzag load balancing gives each rank two chunks)
    ep    divides the experts and dp x cp
    batch the global batch's sequences divide over dp replicas, and each replica's
          over micro-batches of b: m = B / (dp b) is a whole number
    zero-bubble ZB-H1 needs m >= p (calc.pipeline.zero_bubble_fraction)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from minidist.calc.planner.presets import ModelSpec, TrainingSetup

RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)          # 0: DDP; 3: FSDP / ZeRO-3
SCHEDULES = ("1f1b", "interleaved", "zb_h1")


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    cp: int = 1
    ep: int = 1
    zero: int = 1
    micro_batch: int = 1
    recompute: str = "none"
    schedule: str = "1f1b"      # "none" when pp = 1
    virtual_stages: int = 1     # model chunks per stage (interleaved)

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def short(self) -> str:
        """``dp128 tp8 pp16 cp1 ep1 z1 b1 none 1f1b``, the form --explain reads back."""
        sched = self.schedule + (f"-v{self.virtual_stages}" if self.virtual_stages > 1 else "")
        return (f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp} ep{self.ep} z{self.zero} "
                f"b{self.micro_batch} {self.recompute} {sched}")


def parse_layout(text: str) -> Layout:
    """The inverse of ``Layout.short``; missing fields take their defaults."""
    fields: dict = {}
    for word in text.replace(",", " ").split():
        for key, name in (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("cp", "cp"),
                          ("ep", "ep"), ("z", "zero"), ("b", "micro_batch")):
            if word.startswith(key) and word[len(key):].isdigit():
                fields[name] = int(word[len(key):])
                break
        else:
            if word in RECOMPUTE:
                fields["recompute"] = word
            elif word.split("-v")[0] in SCHEDULES + ("none",):
                name, _, v = word.partition("-v")
                fields["schedule"] = name
                fields["virtual_stages"] = int(v) if v else 1
            else:
                raise ValueError(f"cannot read {word!r} in layout {text!r}: write it as "
                                 "'dp8 tp8 pp2 cp1 ep1 z1 b1 full 1f1b' (interleaved-v4 for "
                                 "4 chunks per stage)")
    if not {"dp", "tp", "pp"} <= fields.keys():
        raise ValueError(f"layout {text!r} needs at least dp, tp and pp (e.g. 'dp8 tp8 pp2')")
    if fields["pp"] == 1:
        fields.setdefault("schedule", "none")
    return Layout(**fields)


def microbatches(layout: Layout, setup: TrainingSetup) -> int:
    """m = sequences per step / (dp x b); 0 when it is not a whole number."""
    per_replica, left = divmod(setup.sequences, layout.dp)
    if left or per_replica % layout.micro_batch:
        return 0
    return per_replica // layout.micro_batch


def stage_layers(spec: ModelSpec, layout: Layout) -> tuple[int, int, int]:
    """Layers on the (first, heaviest middle, last) stage.

    pp divides L: L/p everywhere. pp divides L + 2: (L + 2)/p in the middle and one
    fewer on the first and last stages, which hold the embedding and the output layer.
    """
    L, p = spec.layers, layout.pp
    if p == 1:
        return L, L, L
    if L % p == 0:
        return L // p, L // p, L // p
    middle = (L + 2) // p
    return middle - 1, middle, middle - 1


def violations(spec: ModelSpec, setup: TrainingSetup, layout: Layout,
               gpus: int, gpus_per_node: int) -> list[str]:
    """Every divisibility rule the layout breaks, in words (empty: it can run)."""
    out = []
    if layout.gpus != gpus:
        out.append(f"dp x tp x pp x cp = {layout.gpus}, not the {gpus} GPUs")
    if spec.heads % layout.tp or spec.kv_heads % layout.tp:
        out.append(f"tp {layout.tp} does not divide {spec.heads} heads and "
                   f"{spec.kv_heads} KV heads")
    if layout.tp > gpus_per_node:
        out.append(f"tp {layout.tp} spans nodes of {gpus_per_node} GPUs")
    if layout.pp > spec.layers:
        out.append(f"pp {layout.pp} > {spec.layers} layers")
    elif layout.pp > 1 and spec.layers % layout.pp and (spec.layers + 2) % layout.pp:
        out.append(f"pp {layout.pp} divides neither {spec.layers} layers nor "
                   f"{spec.layers} + 2")
    chunks = layout.pp * layout.virtual_stages
    if layout.schedule == "interleaved" and spec.layers % chunks and (spec.layers + 2) % chunks:
        out.append(f"interleaved: pp x v = {chunks} divides neither {spec.layers} layers "
                   f"nor {spec.layers} + 2")
    if (layout.pp == 1) != (layout.schedule == "none"):
        out.append(f"schedule {layout.schedule!r} with pp {layout.pp}")
    if setup.seq % (2 * layout.cp) and layout.cp > 1:
        out.append(f"cp {layout.cp}: 2 cp does not divide the sequence length {setup.seq}")
    if layout.ep > 1 and (not spec.moe or spec.experts % layout.ep
                          or (layout.dp * layout.cp) % layout.ep):
        out.append(f"ep {layout.ep} does not divide {spec.experts} experts and "
                   f"dp x cp = {layout.dp * layout.cp}")
    m = microbatches(layout, setup)
    if m == 0:
        out.append(f"{setup.sequences} sequences do not split into dp {layout.dp} x "
                   f"micro-batches of {layout.micro_batch}")
    elif layout.schedule == "zb_h1" and m < layout.pp:
        out.append(f"zb_h1 needs m >= p: m = {m}, p = {layout.pp}")
    elif layout.schedule == "interleaved" and m % layout.pp:
        out.append(f"interleaved needs p to divide m: m = {m}, p = {layout.pp}")
    return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(spec: ModelSpec, setup: TrainingSetup, gpus: int,
                      gpus_per_node: int, max_micro_batch: int = 8) -> Iterator[Layout]:
    """Every layout of ``gpus`` GPUs: all factorings dp x tp x pp x cp, every ep, ZeRO
    stage, micro-batch up to ``max_micro_batch``, recomputation and schedule (interleaved
    with every v that divides the stage's layers). Rule-breaking ones are yielded too:
    the search counts why each is excluded."""
    for tp in divisors(min(gpus, gpus_per_node)):
        if gpus % tp:
            continue
        for cp in divisors(gpus // tp):
            for pp in divisors(gpus // (tp * cp)):
                if pp > spec.layers:
                    continue
                dp = gpus // (tp * cp * pp)
                eps = [e for e in divisors(spec.experts) if (dp * cp) % e == 0] if spec.moe \
                    else [1]
                schedules = [("none", 1)] if pp == 1 else [("1f1b", 1), ("zb_h1", 1)] + [
                    ("interleaved", v) for v in range(2, spec.layers // pp + 1)
                    if spec.layers % (pp * v) == 0 or (spec.layers + 2) % (pp * v) == 0]
                for ep in eps:
                    for b in divisors(max_micro_batch):
                        for zero in ZERO_STAGES:
                            for recompute in RECOMPUTE:
                                for schedule, v in schedules:
                                    yield Layout(dp, tp, pp, cp, ep, zero, b, recompute,
                                                 schedule, v)
