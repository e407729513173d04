"""PNG plots of a benchmark record: TFLOP/s against seqlen (one panel per head dim and mask) for each
forward/backward grid, bandwidth per decode row, extra device memory against seqlen (log scale), and
for a train_e2e.py record the training throughput and peak memory per model.

    python3 bench/report_plots.py RECORD.json [--stem STEM]   (writes STEM-GRID.png; STEM defaults
                                                              to the record's path without .json)
"""

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"tileattn": dict(color="C3", marker="o", linewidth=2.2), "torch-flash": dict(color="C0", marker="s"),
         "torch-cudnn": dict(color="C2", marker="^"), "torch-efficient": dict(color="C1", marker="v"),
         "torch-math": dict(color="C7", marker="x"), "torch-cpu": dict(color="C0", marker="s")}
LABEL = {"torch-cudnn": "SDPA cuDNN", "torch-flash": "SDPA flash (FA2)", "torch-math": "standard (math)"}


def impls_of(rows):
    return sorted({x["impl"] for x in rows}, key=lambda i: list(STYLE).index(i) if i in STYLE else len(STYLE))


def skipped_note(rows, impl, value):
    """'impl: reason' when every row of impl was skipped or failed, for the figure's footnote."""
    mine = [x for x in rows if x["impl"] == impl]
    if mine and all(x.get(value) is None for x in mine):
        why = mine[0].get("skipped") or mine[0].get("error") or ""
        return f"{impl}: no rows ({why[:90]})"
    return None


def footnote(fig, rows, doc, value="ms", prefix=""):
    """Writes which implementations have no data and the run's identity under the plots; returns the
    fraction of the figure's height it takes. rows may be a list of (prefix, rows) groups."""
    groups = rows if rows and isinstance(rows[0], tuple) else [(prefix, rows)]
    notes = [f"{pre}{n}" for pre, group in groups for n in (skipped_note(group, i, value) for i in impls_of(group)) if n]
    notes.append(f"{doc['device']}, {doc['date']}, commit {str(doc['commit'])[:10]}, torch {doc['torch']}")
    fig.text(0.01, 0.005, "\n".join(notes), fontsize=7, va="bottom")
    return 0.02 + 0.13 * len(notes) / fig.get_figheight()


def throughput(doc, grid, path):
    rows = [x for x in doc["rows"] if x["grid"] == grid]
    hdims = sorted({x["hdim"] for x in rows})
    fig, axes = plt.subplots(2, len(hdims), figsize=(4.2 * len(hdims), 7.2), squeeze=False, sharey=True)
    ceiling = (doc.get("ceilings") or {}).get("matmul_bf16_tflops")
    for col, d in enumerate(hdims):
        for r, causal in enumerate((False, True)):
            ax = axes[r][col]
            for impl in impls_of(rows):
                pts = sorted((x["seqlen_q"], x["tflops"]) for x in rows
                             if x["impl"] == impl and x["hdim"] == d and x["causal"] == causal and x["tflops"])
                if pts:
                    ax.plot(*zip(*pts), label=impl, **STYLE.get(impl, {}))
            if ceiling:
                ax.axhline(ceiling, color="k", linestyle=":", linewidth=0.8, label="bf16 matmul")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{grid}, head dim {d}, {'causal' if causal else 'no mask'}", fontsize=10)
            ax.set_xlabel("seqlen")
            ax.grid(alpha=0.3)
            if col == 0:
                ax.set_ylabel("TFLOP/s")
    handles = {h.get_label(): h for ax in axes.flat for h in ax.get_lines()}
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, footnote(fig, rows, doc), 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def decode(doc, grid, path):
    rows = [x for x in doc["rows"] if x["grid"] == grid]
    shapes = list(dict.fromkeys((x["batch"], x["seqlen_k"], x["heads_q"], x["heads_kv"]) for x in rows))
    impls = impls_of(rows)
    width = 0.8 / max(len(impls), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.9 * len(shapes)), 4.6))
    for n, impl in enumerate(impls):
        vals = []
        for s in shapes:
            hit = [x["tbps"] for x in rows if x["impl"] == impl and
                   (x["batch"], x["seqlen_k"], x["heads_q"], x["heads_kv"]) == s and x["tbps"]]
            vals.append(hit[0] if hit else 0.0)
        ax.bar([i + (n - (len(impls) - 1) / 2) * width for i in range(len(shapes))], vals, width, label=impl,
               color=STYLE.get(impl, {}).get("color"))
    ceiling = (doc.get("ceilings") or {}).get("copy_tbps")
    if ceiling:
        ax.axhline(ceiling, color="k", linestyle=":", linewidth=0.8, label="device copy")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"b={b} kv={n}\nheads {hq}/{hk}" for b, n, hq, hk in shapes], fontsize=8)
    ax.set_ylabel("TB/s (K and V bytes / time)")
    ax.set_title(f"{grid}: one query row, head dim {rows[0]['hdim'] if rows else ''}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout(rect=(0, footnote(fig, rows, doc), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory(doc, path):
    rows = doc["memory"]
    passes = list(dict.fromkeys(x["pass"] for x in rows))
    fig, axes = plt.subplots(1, len(passes), figsize=(5.5 * len(passes), 4.4), squeeze=False)
    for ax, p in zip(axes[0], passes):
        mine = [x for x in rows if x["pass"] == p]
        for impl in impls_of(mine):
            # Zero extra bytes cannot sit on a log axis: drawn at 1 KiB, the axis' floor.
            pts = sorted((x["seqlen"], max(x["extra_bytes"], 1024) / 2**20) for x in mine
                         if x["impl"] == impl and x["extra_bytes"] is not None)
            if pts:
                ax.plot(*zip(*pts), label=impl, **STYLE.get(impl, {}))
        shape = mine[0]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("extra device memory (MiB)")
        ax.set_title(f"{p}: batch {shape['batch']}, {shape['heads']} heads of {shape['hdim']}, {shape['dtype']}",
                     fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, footnote(fig, [(f"{p}: ", [x for x in rows if x["pass"] == p]) for p in passes], doc,
                                                "extra_bytes"), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def e2e(doc, grid, path):
    """Training throughput (tokens/s) and peak memory per (model, seqlen), one bar per implementation;
    a run that ran out of memory is marked OOM."""
    rows = [x for x in doc["rows"] if x["grid"] == grid]
    cases = list(dict.fromkeys((x["model"], x["seqlen"]) for x in rows))
    impls = impls_of(rows)
    width = 0.8 / len(impls)
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 1.3 * len(cases) + 2), 7.2), sharex=True)
    for ax, key, label in ((axes[0], "tokens_per_s", "tokens/s (thousands)"), (axes[1], "peak_gib", "peak memory (GiB)")):
        for k, impl in enumerate(impls):
            at = {(x["model"], x["seqlen"]): x for x in rows if x["impl"] == impl}
            for c, case in enumerate(cases):
                x = at.get(case)
                if x is None:
                    continue
                pos = c - 0.4 + width * (k + 0.5)
                value = x.get(key)
                if value is None:
                    ax.text(pos, 0, "OOM" if "memory" in str(x.get("error", "")) else "n/a", rotation=90,
                            ha="center", va="bottom", fontsize=7, color=STYLE.get(impl, {}).get("color"))
                    continue
                ax.bar(pos, value / 1000 if key == "tokens_per_s" else value, width,
                       color=STYLE.get(impl, {}).get("color"), label=LABEL.get(impl, impl) if c == 0 else None)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_title(f"training step, bf16 autocast, {rows[0]['batch'] * rows[0]['seqlen']} tokens a step", fontsize=10)
    axes[1].set_xticks(range(len(cases)), [f"{m}\n{s // 1024}k tokens" for m, s in cases], fontsize=8)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", ncol=len(impls), fontsize=8)
    fig.tight_layout(rect=(0, footnote(fig, rows, doc, "step_ms"), 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(doc, stem):
    """Draws every plot the record has data for; returns the paths written."""
    paths = []
    grids = list(dict.fromkeys(x["grid"] for x in doc["rows"]))
    for grid in grids:
        path = f"{stem}-{grid}.png"
        (decode if grid.endswith("decode") else e2e if grid == "e2e" else throughput)(doc, grid, path)
        paths.append(path)
    if doc.get("memory"):
        memory(doc, f"{stem}-memory.png")
        paths.append(f"{stem}-memory.png")
    return paths


def main():
    ap = argparse.ArgumentParser(description="PNG plots of a benchmark record")
    ap.add_argument("record")
    ap.add_argument("--stem", help="output path without -GRID.png (default: the record's path without .json)")
    args = ap.parse_args()
    with open(args.record) as f:
        doc = json.load(f)
    for path in draw(doc, args.stem or args.record.removesuffix(".json")):
        print(path)


if __name__ == "__main__":
    main()
