"""The demos' figures: one function per figure, each saving one PNG.

A demo run with ``--figure PATH`` hands what it measured to one of these
functions; without ``--figure`` no figure is drawn. matplotlib is optional
(``pip install 'minidist[plot]'``): when it is missing, the function prints a
note and the demo goes on. The Agg backend draws to files only, so no display
is needed. ``docs/make_figures.py`` runs every demo this way to regenerate
``docs/figures/``.
"""
from __future__ import annotations

import numpy as np

DPI = 100          # small files: the docs show them at about this size
OP_COLORS = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green"}   # pipeline ops


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None (with a note) if not installed."""
    try:
        import matplotlib
    except ImportError:
        print("(no figure: matplotlib is not installed; pip install 'minidist[plot]')")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path: str) -> None:
    """Save as a PNG of at most 256 colours (a third of the bytes, the same picture)."""
    import io
    from PIL import Image                       # installed with matplotlib
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    Image.open(buffer).convert("RGB").quantize(colors=256).save(path, optimize=True)
    print(f"figure: {path}")


def _mean10(values) -> np.ndarray:
    """The mean of each window of 10 consecutive values (as the demos print losses)."""
    k = min(10, len(values))
    return np.convolve(values, np.ones(k) / k, mode="valid")


def training_curves(path, losses, held_out, lrs, grad_norms, max_norm, uniform, title):
    """Demo 01: train and held-out loss, the learning-rate schedule, the gradient norm."""
    plt = _pyplot()
    if plt is None:
        return
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(11, 3.2))
    smooth = _mean10(losses)
    ax1.plot(np.arange(len(smooth)) + len(losses) - len(smooth), smooth, label="train (10-step mean)")
    ax1.plot(*zip(*held_out), "o-", label="held-out")
    ax1.axhline(uniform, color="gray", ls=":", label="uniform guess log V")
    ax1.set(xlabel="step", ylabel="cross-entropy", title=title)
    ax1.legend(fontsize=8)
    ax2.plot(lrs)
    ax2.set(xlabel="step", ylabel="learning rate", title="warmup + cosine")
    ax3.semilogy(grad_norms, lw=0.8, label="‖g‖ before clipping")
    ax3.axhline(max_norm, color="tab:red", ls="--", label=f"clipped to {max_norm}")
    ax3.set(xlabel="step", ylabel="gradient norm", title="clip_grad_norm_")
    ax3.legend(fontsize=8)
    _save(plt, fig, path)


def bandwidth(path, sizes, times, alpha, beta, n):
    """Demo 03: ring all-reduce time and bus bandwidth vs message size, with the alpha-beta fit."""
    from minidist.comm.collectives import cost
    plt = _pyplot()
    if plt is None:
        return
    sizes, times = np.array(sizes, dtype=float), np.array(times)
    grid = np.geomspace(sizes[0], sizes[-1], 100)
    model = np.array([cost.ring_all_reduce(m, n, alpha, beta).seconds for m in grid])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.loglog(sizes, times * 1e6, "o", label="measured")
    ax1.loglog(grid, model * 1e6, label="model T = 2(N-1)α + 2(N-1)/N · M/β")
    ax1.loglog(grid, np.full_like(grid, 2 * (n - 1) * alpha * 1e6), ":", label="α term")
    ax1.loglog(grid, 2 * (n - 1) / n * grid / beta * 1e6, "--", label="β term")
    crossover = n * alpha * beta           # where the two terms are equal
    if sizes[0] <= crossover <= sizes[-1]:
        ax1.axvline(crossover, color="gray", lw=0.8)
        ax1.text(crossover, 0.03, "latency-bound | bandwidth-bound", ha="center", fontsize=8,
                 transform=ax1.get_xaxis_transform(), backgroundcolor="white")
    ax1.set(xlabel="message size M (bytes)", ylabel="time (µs)",
            title=f"ring all-reduce, N = {n}: α = {alpha * 1e6:.0f} µs, β = {beta / 1e9:.2f} GB/s")
    ax1.legend(fontsize=8, loc="upper left")
    busbw = [cost.bus_bandwidth(m, n, t)[1] / 1e9 for m, t in zip(sizes, times)]
    ax2.semilogx(sizes, busbw, "o-", label="measured")
    ax2.semilogx(grid, [cost.bus_bandwidth(m, n, t)[1] / 1e9 for m, t in zip(grid, model)],
                 label="model")
    ax2.axhline(beta / 1e9, color="gray", ls="--", label="β (the limit)")
    ax2.set(xlabel="message size M (bytes)", ylabel="bus bandwidth (GB/s)",
            title="busbw = 2(N-1)/N · M / T")
    ax2.legend(fontsize=8)
    _save(plt, fig, path)


def bucket_timeline(path, timeline, n, bucket_mb):
    """Demo 04: backward compute on one bar, each bucket's all-reduce on its own."""
    plt = _pyplot()
    if plt is None:
        return
    end = timeline[-1]["backward_end_ms"]
    buckets = timeline[:-1]
    fig, ax = plt.subplots(figsize=(10, 1.4 + 0.45 * len(buckets)))
    ax.barh(0, end, color="tab:gray", label="backward (compute)")
    for y, ev in enumerate(buckets, start=1):
        start, stop = ev["comm_start_ms"], ev["comm_end_ms"]
        ax.barh(y, start - ev["ready_ms"], left=ev["ready_ms"], color="tab:gray", alpha=0.3)
        hidden_to = min(stop, end)
        if hidden_to > start:
            ax.barh(y, hidden_to - start, left=start, color="tab:green")
        if stop > end:
            ax.barh(y, stop - max(start, end), left=max(start, end), color="tab:orange")
        ax.text(stop, y, f" {ev['bytes'] / 1e3:.0f} kB", va="center", fontsize=8)
    ax.axvline(end, color="black", lw=0.8)
    ax.barh(0, 0, color="tab:gray", alpha=0.3, label="ready, queued behind earlier buckets")
    ax.barh(0, 0, color="tab:green", label="all-reduce, hidden behind backward")
    ax.barh(0, 0, color="tab:orange", label="all-reduce, after backward (exposed)")
    ax.set_yticks(range(len(buckets) + 1),
                  ["backward"] + [f"bucket {ev['bucket']}" for ev in buckets])
    ax.invert_yaxis()
    ax.set(xlabel="ms after forward ended",
           title=f"DDP, {n} ranks, buckets of ≤ {bucket_mb} MB: rank 0's last step "
                 f"(hidden fraction {timeline[-1]['hidden_fraction']:.2f})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(plt, fig, path)


def zero_memory(path, rows, n):
    """Demo 05: bytes per parameter (weights, grads, optimizer) per stage, with the formula.

    rows: (precision, name, weights, grads, optimizer, formula), all per parameter."""
    plt = _pyplot()
    if plt is None:
        return
    precisions = list(dict.fromkeys(r[0] for r in rows))
    fig, axes = plt.subplots(1, len(precisions), figsize=(10, 3.6), sharey=True)
    for ax, precision in zip(np.atleast_1d(axes), precisions):
        mine = [r for r in rows if r[0] == precision]
        x = np.arange(len(mine))
        bottom = np.zeros(len(mine))
        for i, part in enumerate(("weights", "gradients", "optimizer state")):
            heights = np.array([r[2 + i] for r in mine])
            ax.bar(x, heights, 0.6, bottom=bottom, label=part)
            bottom += heights
        ax.plot(x, [r[5] for r in mine], "k_", markersize=30, mew=2, label="formula")
        ax.set_xticks(x, [r[1] for r in mine])
        ax.set(title=f"Adam, {precision}, N = {n}: measured (bars), formula (line)",
               ylabel="bytes per parameter on rank 0")
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def tensor_parallel(path, dense_params, held, t, traffic, blocks_formula):
    """Demo 06: parameters per rank vs the dense model, and bytes sent per collective.

    traffic: {case label: {collective: bytes sent by rank 0}}."""
    plt = _pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1, 2]})
    ax1.bar(["one\nprocess", f"per rank\n(t = {t})", "dense / t"],
            [dense_params, held, dense_params / t], color=["tab:gray", "tab:blue", "tab:olive"])
    ax1.set(ylabel="parameters", title="weights held")
    cases = list(traffic)
    kinds = sorted({k for c in traffic.values() for k in c})
    bottom = np.zeros(len(cases))
    for kind in kinds:
        kib = np.array([traffic[c].get(kind, 0) / 1024 for c in cases])
        ax2.bar(range(len(cases)), kib, 0.6, bottom=bottom, label=kind)
        bottom += kib
    ax2.axhline(blocks_formula / 1024, color="black", ls="--",
                label="formula, blocks only: 2 all-reduces per layer")
    ax2.set_xticks(range(len(cases)), cases)
    ax2.set(ylabel="KiB sent by rank 0", title="communication of one step",
            ylim=(0, 1.4 * max(bottom.max(), blocks_formula / 1024)))
    ax2.legend(fontsize=8, ncol=2, loc="upper left")
    _save(plt, fig, path)


def pipeline_timelines(path, measured, p):
    """Demos 07 and 17: the measured timeline of each schedule, one row per stage."""
    plt = _pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(len(measured), 1, figsize=(10, 1 + len(measured) * (0.4 * p + 0.6)))
    for ax, (name, timelines) in zip(np.atleast_1d(axes), measured.items()):
        t0 = min(s for row in timelines for _, s, _ in row)
        for r, row in enumerate(timelines):
            for op, s, e in row:
                # a white edge round each op: consecutive ops of one kind (GPipe's
                # forwards) stay separate bars instead of merging into one
                ax.broken_barh([(s - t0, e - s)], (r - 0.4, 0.8),
                               facecolor=OP_COLORS[op.kind], edgecolor="white", linewidth=0.8)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel("stage")
        ax.set_yticks(range(p))
        ax.invert_yaxis()
    split = any(op.kind == "W" for rows in measured.values() for row in rows for op, _, _ in row)
    ax.set_xlabel("seconds (blue: forward, orange: backward"
                  + (" (B: input gradient), green: W (weight gradient)" if split else "")
                  + "; one bar per op, white space: the bubble)")
    _save(plt, fig, path)


def mesh_3d(path, coords, held, shape, losses_3d, losses_single):
    """Demo 08: which rank sits where in the dp x pp x tp mesh, and the losses."""
    plt = _pyplot()
    if plt is None:
        return
    from matplotlib.patches import Rectangle
    tp = shape["tp"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    for rank, (c, h) in enumerate(zip(coords, held)):
        x, y = c["pp"] * (tp + 0.6) + c["tp"], c["dp"]
        ax1.add_patch(Rectangle((x, y), 0.9, 0.8, color=f"C{c['pp']}", alpha=0.5))
        ax1.text(x + 0.45, y + 0.4, f"rank {rank}\n{h:,} params", ha="center", va="center",
                 fontsize=8)
        if c["tp"] == 0:                                   # outline the TP group
            ax1.add_patch(Rectangle((x - 0.05, y - 0.05), tp, 0.9, fill=False, lw=1.5))
    for s in range(shape["pp"]):
        ax1.text(s * (tp + 0.6) + tp / 2, -0.25, f"stage {s}", ha="center", fontsize=9)
    ax1.set_yticks([d + 0.4 for d in range(shape["dp"])],
                   [f"replica {d}" for d in range(shape["dp"])])
    ax1.set_xlim(-0.3, shape["pp"] * (tp + 0.6))
    ax1.set_ylim(shape["dp"], -0.45)
    ax1.set_xticks([])
    ax1.set_title(f"mesh dp={shape['dp']} x pp={shape['pp']} x tp={shape['tp']} "
                  "(outlined: a TP group)", fontsize=10)
    steps = np.arange(len(losses_single))
    ax2.plot(steps, losses_single, "o-", label="one process")
    ax2.plot(steps, losses_3d, "x--", markersize=10, label="3D (mean over replicas)")
    ax2.set(xlabel="step", ylabel="loss", title="the same steps", xticks=steps)
    ax2.legend(fontsize=8)
    _save(plt, fig, path)


def checkpoint_resume(path, straight, resumed, saved_at, shard_bytes):
    """Demo 12: the loss per step, uninterrupted and resumed; the bytes of each shard file."""
    plt = _pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [2, 1]})
    ax1.plot(straight, "k-", lw=3, alpha=0.3, label="uninterrupted, 4 ranks")
    for (n, losses), marker in zip(resumed.items(), "o^s"):
        ax1.plot(range(saved_at, saved_at + len(losses)), losses, marker, fillstyle="none",
                 markersize=6 + 2 * n, label=f"resumed on {n} ranks")
    ax1.axvline(saved_at - 0.5, color="gray", ls=":", label="saved here")
    ax1.set(xlabel="step", ylabel="loss (mean over ranks)", title="save at 4 ranks, resume")
    ax1.legend(fontsize=8)
    ax2.bar([f"shard {r}" for r in range(len(shard_bytes))], np.array(shard_bytes) / 1024)
    ax2.set(ylabel="KiB", title="shard files (weights, m, v)")
    _save(plt, fig, path)


def precision_runs(path, runs, scales):
    """Demo 09: each precision's loss curve, and GradScaler's loss scale per step."""
    plt = _pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    for mode, run in runs.items():
        ax1.plot(_mean10(run[0]), label=mode)
    ax1.set(xlabel="step", ylabel="loss (10-step mean)", title="training loss")
    ax1.legend(fontsize=8)
    ax2.semilogy(scales, base=2)
    ax2.set(xlabel="step", ylabel="loss scale S (halved on overflow)",
            title="GradScaler's loss scale, fp16 + scaling")
    _save(plt, fig, path)


def attention_memory(path, lengths, naive_bytes, flash_bytes, heads, d):
    """Demo 10: peak extra memory of forward + backward vs sequence length."""
    plt = _pyplot()
    if plt is None:
        return
    s = np.array(lengths, dtype=float)
    naive, flash = np.array(naive_bytes) / 2**20, np.array(flash_bytes) / 2**20
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.loglog(s, naive, "o-", label="naive (keeps the s x s matrix)")
    ax.loglog(s, flash, "o-", label="flash (keeps O and L)")
    ax.loglog(s, naive[-1] * (s / s[-1]) ** 2, ":", color="gray", label="∝ s²")
    ax.loglog(s, flash[-1] * (s / s[-1]), "--", color="gray", label="∝ s")
    ax.set(xlabel="sequence length s", ylabel="peak extra memory (MiB)",
           title=f"attention forward + backward, {heads} heads, d = {d}, float64")
    ax.set_xticks(s, [str(int(x)) for x in s])
    ax.set_xticks([], minor=True)
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def ring_work(path, work, n, length, causal):
    """Demo 11: query-key pairs each rank scores, per split of the sequence."""
    plt = _pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    width = 0.8 / len(work)
    for i, (layout, pairs) in enumerate(work.items()):
        ax.bar(np.arange(n) + i * width, pairs, width, label=f"{layout} "
               f"(busiest / average = {max(pairs) / (sum(pairs) / n):.2f})")
    first = next(iter(work.values()))
    ax.axhline(sum(first) / n, color="black", ls="--", lw=0.8, label="average")
    ax.set_xticks(np.arange(n) + 0.4 - width / 2, [f"rank {r}" for r in range(n)])
    ax.set(ylabel="query-key pairs scored",
           title=f"{'causal' if causal else 'full'} ring attention, sequence {length} on {n} ranks")
    ax.legend(fontsize=8)
    _save(plt, fig, path)



def moe_balance(path, runs, factors, dropped, n_expert, k):
    """Demo 15: tokens per expert under three balancing rules; dropped vs capacity."""
    plt = _pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    width = 0.8 / len(runs)
    for i, (name, counts) in enumerate(runs.items()):
        left.bar(np.arange(n_expert) + i * width, counts, width, label=name)
    left.set_xticks(np.arange(n_expert) + 0.4 - width / 2, [f"E{e}" for e in range(n_expert)])
    left.set(ylabel="assignments", title=f"load per expert after training (top-{k})")
    left.legend(fontsize=7)
    right.plot(factors, [100 * d for d in dropped], marker="o")
    right.set(xlabel="capacity factor", ylabel="dropped assignments (%)",
              title="C = ceil(cf * tokens * k / E)")
    _save(plt, fig, path)


def ulysses_vs_ring(path, rows, n):
    """Demo 16: bytes per rank and time of Ulysses and ring attention per length."""
    plt = _pyplot()
    if plt is None:
        return
    s = [r[0] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    left.plot(s, [r[1] / 1024 for r in rows], marker="o", label="Ulysses")
    left.plot(s, [r[3] / 1024 for r in rows], marker="s", label="ring")
    left.set(xlabel="sequence length", ylabel="KiB sent per rank",
             title=f"forward + backward, {n} ranks")
    right.plot(s, [r[2] * 1e3 for r in rows], marker="o", label="Ulysses")
    right.plot(s, [r[4] * 1e3 for r in rows], marker="s", label="ring")
    right.set(xlabel="sequence length", ylabel="ms (slowest rank)", title="time")
    for ax in (left, right):
        ax.legend(fontsize=8)


def compression(path, runs):
    """Demo 18: loss vs step, loss vs wall time, and bytes sent, one line per hook.

    runs: label -> dict(losses, times (s since start), bytes (sent per rank))."""
    plt = _pyplot()
    if plt is None:
        return
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(13, 3.6))
    for label, r in runs.items():
        a1.plot(range(1, len(r["losses"]) + 1), r["losses"], label=label)
        a2.plot(r["times"], r["losses"], label=label)
    labels = list(runs)
    a3.barh(range(len(labels)), [runs[k]["bytes"] / 1e6 for k in labels], color="tab:blue")
    a3.set_yticks(range(len(labels)), labels)
    a3.invert_yaxis()
    a1.set(xlabel="step", ylabel="loss", yscale="log", title="loss vs step")
    a2.set(xlabel="wall time (s)", yscale="log", title="loss vs wall time")
    a3.set(xlabel="MB sent per rank", title="bytes sent")
    a1.legend(fontsize=8)
    _save(plt, fig, path)


def llama_runs(path, single, mesh, shape):
    """Demo 21: the Llama's loss in one process and on the mesh, and their difference."""
    plt = _pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    steps = np.arange(len(single))
    ax1.plot(steps, single, "o-", markersize=3, label="one process")
    ax1.plot(steps, mesh, "x--", markersize=6,
             label=f"dp={shape['dp']} x tp={shape['tp']} x pp={shape['pp']}")
    ax1.set(xlabel="step", ylabel="loss", title="tiny Llama on the corpus")
    ax1.legend(fontsize=8)
    diff = np.abs(np.asarray(mesh) - np.asarray(single))
    ax2.semilogy(steps, np.maximum(diff, 1e-18), ".-")
    ax2.axhline(1e-12, color="gray", ls=":", label="tolerance 1e-12")
    ax2.set(xlabel="step", ylabel="|mesh - one process|", title="loss difference (float64)")
    ax2.legend(fontsize=8)
    _save(plt, fig, path)


def placements_counts(path, runs):
    """Demo 22: the collectives CommDebugMode counted, forward and backward, per run.

    runs: label -> {"forward": {collective: count}, "backward": {...}}."""
    plt = _pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.4))
    for ax, (label, counts) in zip(np.atleast_1d(axes), runs.items()):
        names = sorted(set(counts["forward"]) | set(counts["backward"]))
        x = np.arange(len(names))
        ax.bar(x - 0.2, [counts["forward"].get(k, 0) for k in names], 0.4, label="forward")
        ax.bar(x + 0.2, [counts["backward"].get(k, 0) for k in names], 0.4, label="backward")
        ax.set_xticks(x, names, fontsize=8)
        ax.set(title=label, ylabel="calls per step")
        ax.legend(fontsize=8)
    _save(plt, fig, path)


def block_scaling_runs(path, runs):
    """Demo 23: the loss curve of each format, block-scaled and not."""
    plt = _pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for mode, losses in runs.items():
        style = "--" if "fp4" in mode else "-"
        ax.plot(_mean10(losses), style, label=mode)
    ax.set(xlabel="step", ylabel="loss (10-step mean)",
           title="GPT training loss: matmuls in each format")
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def diloco_runs(path, runs):
    """Demo 25: held-out loss vs wall time and vs bytes sent across the slow link.

    runs: label -> dict(losses, times (s since start), sent (bytes across, cumulative))."""
    plt = _pyplot()
    if plt is None:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for label, r in runs.items():
        a1.plot(r["times"], r["losses"], label=label)
        a2.plot(np.maximum(np.array(r["sent"]) / 1e6, 1e-3), r["losses"], label=label)
    a1.set(xlabel="wall time (s)", ylabel="held-out loss", yscale="log",
           title="loss vs wall time")
    a2.set(xlabel="MB sent per rank across the slow link", xscale="log", yscale="log",
           title="loss vs slow-link bytes")
    a1.legend(fontsize=8)
    _save(plt, fig, path)


def fault_tolerance_runs(path, runs, kill_step):
    """Demo 27: held-out loss vs wall time, uninterrupted, per-step FT and restart.

    runs: label -> dict(losses [(step, loss)], times (s since the run's start))."""
    plt = _pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for label, r in runs.items():
        ax.plot(r["times"], [loss for _, loss in r["losses"]], label=label)
    ax.set(xlabel="training time (s; the first world's start left out)",
           ylabel="held-out loss", yscale="log", title=f"a replica killed at step {kill_step}")
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def optimizer_runs(path, runs, title):
    """Demo 26: the loss curve of each optimizer."""
    plt = _pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for name, losses in runs.items():
        ax.plot(_mean10(losses), label=name)
    ax.set(xlabel="step", ylabel="loss (10-step mean)", title=title)
    ax.legend(fontsize=8)
    _save(plt, fig, path)
