"""Demo 14: the cost models of minidist.calc, observed in a run of minidist's own GPT.

Two counts a training step makes, each beside its closed form:

    (a) bytes one transformer block keeps for backward, measured by walking the
        autograd graph (minidist.autograd.saved_bytes), against
        calc.minidist_layer_activation_bytes, Korthikanti et al. 2022's
        s b h (34 + 5 a s / h) specialised to this block (float32, tanh GELU,
        LayerNorm saving x_hat, no dropout), with naive and with flash attention:
        the a s^2 b term of the attention scores appears, then vanishes;
    (b) FLOPs of every matrix product one forward + backward runs
        (backend.MatmulFlopCounter), against Narayanan et al. 2021's eq. 3,
        with and without activation checkpointing.

Both are counts, the same on every run. The check: every row within 10%.

    python demos/14_cost_models_observed.py                     # ~10 s
    python demos/14_cost_models_observed.py --points 128,64,4   # one (s, h, a) point
"""
import argparse
import sys

from minidist.calc import (activation_memory_per_layer, minidist_layer_activation_bytes,
                           training_flops_per_iteration)
from minidist.nn.cost_probe import layer_saved_bytes, step_matmul_flops
from _args import positive_int

TOLERANCE = 0.10


def parse_point(text: str) -> tuple[int, int, int]:
    s, h, a = (int(v) for v in text.split(","))
    return s, h, a


def memory_table(points, batch: int) -> float:
    """Print measured vs modelled bytes per layer; return the worst relative error."""
    print(f"(a) bytes one block keeps for backward, float32, batch {batch}\n")
    print(f"{'s':>5} {'h':>5} {'a':>3}  {'attention':<14} {'measured':>12} "
          f"{'model':>12} {'ratio':>6}  {'Megatron fp32':>13}")
    worst = 0.0
    for s, h, a in points:
        for attention, checkpoint in (("naive", False), ("flash", False), ("checkpointed", True)):
            kind = "naive" if attention == "checkpointed" else attention
            got = layer_saved_bytes(s, batch, h, a, attention=kind, checkpoint=checkpoint)
            recompute = "full" if checkpoint else "none"
            want = minidist_layer_activation_bytes(s, batch, h, a, flash=kind == "flash",
                                                   recompute=recompute)
            megatron = activation_memory_per_layer(s, batch, h, a, flash=kind == "flash",
                                                   recompute=recompute, bytes_per_element=4)
            worst = max(worst, abs(got / want - 1))
            print(f"{s:>5} {h:>5} {a:>3}  {attention:<14} {got:>12,} {want:>12,.0f} "
                  f"{got / want:6.3f}  {megatron:>13,.0f}")
    print("\nmodel: 20sbh + 2sb + as^2b (naive), 21sbh + 2sb + asb (flash), sbh (checkpointed),"
          "\ntimes 4 bytes. Megatron's layer (34 + 5as/h at 2 bytes, here at 4) keeps 16 sbh"
          "\n+ 2 masks and 2 as^2b + a mask; this block keeps tanh(u) for GELU (+4 sbh),"
          "\nx_hat and 1/std for LayerNorm, and with no dropout no masks and one score copy.")
    return worst


def flops_table(points, batch: int, layers: int, vocab: int) -> float:
    """Print measured vs eq. 3 FLOPs per step; return the worst relative error."""
    print(f"\n(b) matmul FLOPs of one training step, {layers} layers, vocab {vocab}, "
          f"batch {batch}\n")
    print(f"{'s':>5} {'h':>5} {'a':>3}  {'attention':<9} {'checkpoint':<10} "
          f"{'measured':>14} {'eq. 3':>14} {'ratio':>6}")
    worst = 0.0
    for s, h, a in points:
        for attention in ("naive", "flash"):
            for checkpoint in (False, True):
                got = step_matmul_flops(batch, s, layers, h, a, vocab, attention=attention,
                                        checkpoint=checkpoint)
                want = training_flops_per_iteration(batch, s, layers, h, vocab,
                                                    recompute=checkpoint)
                worst = max(worst, abs(got / want - 1))
                print(f"{s:>5} {h:>5} {a:>3}  {attention:<9} {str(checkpoint):<10} "
                      f"{got:>14,} {want:>14,.0f} {got / want:6.3f}")
    print("\nflash's backward recomputes S = Q K^T tile by tile: 2 b s^2 h more per layer,"
          "\nwhich eq. 3 (one product per forward matmul, two per backward) does not count.")
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", nargs="+", type=parse_point,
                    default=[(128, 64, 4), (256, 128, 8), (512, 128, 4)],
                    help="(s, h, a) points as s,h,a (default: three)")
    ap.add_argument("--batch", type=positive_int, default=2)
    ap.add_argument("--layers", type=positive_int, default=2)
    ap.add_argument("--vocab", type=positive_int, default=65)
    args = ap.parse_args()
    worst_memory = memory_table(args.points, args.batch)
    worst_flops = flops_table(args.points, args.batch, args.layers, args.vocab)
    worst = max(worst_memory, worst_flops)
    ok = worst <= TOLERANCE
    print(f"\ncheck: largest |measured / model - 1| = {worst:.4f} (bytes {worst_memory:.4f}, "
          f"FLOPs {worst_flops:.4f}; tolerance {TOLERANCE})  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
