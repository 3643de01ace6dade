"""``npu-rl plot RUN_DIR...``: training curves from runs' ``metrics.jsonl``, no service needed.

Nine panels over the training step: reward, validation accuracy, KL, entropy, response length, clip fraction,
gradient norm, throughput and the time split of a step (stacked by phase; with several runs, each run's step time
with its generation share). Several runs are overlaid, one colour each, for comparison. Writes a PNG and a
self-contained HTML page (the figure as inline SVG plus a table of first/last values; no scripts, no network).

Every training run writes ``curves.png`` / ``curves.html`` into its own folder when it ends.

A RUN_DIR is a run folder (holding ``metrics.jsonl``), the ``metrics.jsonl`` itself, or a
``trainer.default_local_dir`` (its runs under ``logs/*`` are taken, oldest first, each its own line).

Bounded whatever the file: one up to ``FULL_READ_BYTES`` is read whole; a larger one is sampled, ``SAMPLED_ROWS``
rows read at evenly spaced offsets (the first and the last row included), each from at most ``WINDOW_BYTES``, so a
multi-GB metrics.jsonl costs a few hundred MB of reads, and a file that is not JSON lines (no row in its first
``MAX_BAD_SAMPLES`` samples) is refused, naming it. More than ``MAX_ROWS`` rows are thinned evenly for drawing (said).
"""

from __future__ import annotations

import argparse
import glob
import html
import io
import json
import math
import os
import sys
from dataclasses import dataclass, field

from npu_rl.utils.paths import check_output_dir

# (title, y label, [metric keys in order of preference, or a prefix ending in "/" for "every key under it"])
PANELS: list[tuple[str, str, list[str]]] = [
    ("Reward", "mean sequence score", ["critic/score/mean", "critic/rewards/mean"]),
    ("Validation accuracy", "val-core", ["val-core/"]),
    ("KL to the reference", "KL", ["actor/kl_loss", "actor/reward_kl_penalty", "critic/kl"]),
    ("Entropy", "nats / token", ["actor/entropy"]),
    ("Response length", "tokens", ["response_length/mean"]),
    ("Clip fraction", "share of tokens", ["actor/pg_clipfrac"]),
    ("Gradient norm", "actor grad norm", ["actor/grad_norm"]),
    ("Throughput", "tokens / s / device", ["perf/throughput"]),
]
# Drawn (a fourth row) when a run logs a mixture-of-experts model's router metrics (npu_rl/models/moe.py).
MOE_PANELS: list[tuple[str, str, list[str]]] = [
    ("Expert load", "max / mean tokens per expert", ["actor/moe/max_over_mean"]),
    ("Experts without a token", "share of (layer, expert)", ["actor/moe/dead_expert_share"]),
    ("Router auxiliary loss", "load-balancing loss", ["actor/moe/aux_loss"]),
]
# Top-level phases of a step, in execution order (nested timers such as generate_sequences are inside gen).
PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "testing",
          "save_checkpoint")
FULL_READ_BYTES = 64 << 20  # a metrics.jsonl up to this size is read whole (20,000 steps of 53 metrics: 34 MB)
SAMPLED_ROWS = 10_000  # rows read from a larger file, at evenly spaced offsets
WINDOW_BYTES = 64 << 10  # the most read at one offset to find a whole line (a row of 100 metrics is ~4 KB)
MAX_BAD_SAMPLES = 64  # samples with no metrics row before a large file is refused as not JSON lines
MAX_ROWS = 50_000  # rows kept for drawing; more are thinned evenly (the first and the last kept)
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")


@dataclass
class Run:
    label: str
    path: str  # the metrics.jsonl
    rows: list[dict] = field(default_factory=list)
    num_skipped: int = 0  # lines that were not a JSON object with a numeric 'step' (counted, not fatal)
    first_skipped: str = ""
    bounded: str = ""  # how the rows were bounded (sampled from a large file, thinned), said by plot_runs
    _columns: dict[str, tuple[list[int], list[float]]] | None = field(default=None, repr=False)

    def _index(self) -> dict[str, tuple[list[int], list[float]]]:
        """Every numeric metric as (steps, values), built in one pass over the rows (a large file is read once)."""
        if self._columns is None:
            columns: dict[str, tuple[list[int], list[float]]] = {}
            for row in self.rows:
                step = int(row["step"])
                for key, value in row.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                        xs, ys = columns.setdefault(key, ([], []))
                        xs.append(step)
                        ys.append(float(value))
                    else:
                        columns.setdefault(key, ([], []))
            self._columns = columns
        return self._columns

    def series(self, key: str) -> tuple[list[int], list[float]]:
        xs, ys = self._index().get(key, ([], []))
        return list(xs), list(ys)

    def keys(self) -> set[str]:
        return set(self._index())


def find_metrics(target: str) -> list[str]:
    """metrics.jsonl files named by one RUN_DIR argument (see the module doc)."""
    target = os.path.abspath(os.path.expanduser(target))
    if os.path.isfile(target):
        return [target]
    if os.path.isfile(os.path.join(target, "metrics.jsonl")):
        return [os.path.join(target, "metrics.jsonl")]
    found = sorted(glob.glob(os.path.join(target, "logs", "*", "metrics.jsonl")))
    if not found:
        raise FileNotFoundError(f"{target}: no metrics.jsonl there, nor under {os.path.join(target, 'logs', '*')}")
    return found


def load_run(path: str, label: str | None = None) -> Run:
    """The rows of one metrics.jsonl, read in one pass (a large file sampled, see the module doc); a line that is
    not a JSON object with a numeric ``step`` (a partial last line of a killed run, a corrupt line) is skipped and
    counted, never fatal to the whole run."""
    run = Run(label or _label(path), path)
    if not os.path.isfile(path):  # a FIFO, a device (/dev/zero): reading it may never end
        raise ValueError(f"{path} is not a regular file")
    size = os.path.getsize(path)
    if size <= FULL_READ_BYTES:
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                _add_line(run, line, f"line {lineno}")
    else:
        _read_sampled(run, path, size)
    if len(run.rows) > MAX_ROWS:
        kept = [run.rows[len(run.rows) * i // MAX_ROWS] for i in range(MAX_ROWS - 1)] + [run.rows[-1]]
        run.bounded += f"{'; ' if run.bounded else ''}{len(run.rows)} rows thinned evenly to {len(kept)} for drawing"
        run.rows = kept
    return run


def _add_line(run: Run, line: bytes, where: str) -> bool:
    """Append ``line``'s row, or skip and count it; whether it was a row."""
    if not line.strip():
        return False
    try:
        row = json.loads(line.decode("utf-8", errors="replace"))
    except (json.JSONDecodeError, RecursionError) as exc:
        _skip(run, where, getattr(exc, "msg", "nested too deeply"))
        return False
    step = row.get("step") if isinstance(row, dict) else None
    if not isinstance(step, (int, float)) or isinstance(step, bool) or not math.isfinite(step):
        _skip(run, where, "no numeric 'step'")
        return False
    run.rows.append(row)
    return True


def _read_sampled(run: Run, path: str, size: int) -> None:
    """``SAMPLED_ROWS`` rows at evenly spaced offsets of a file larger than ``FULL_READ_BYTES``: at each, the first
    line that starts at or after the offset (the file's first line at offset 0), and the file's last line."""
    seen: set[int] = set()  # line starts already read (rows longer than the spacing are met twice)
    bad = 0
    with open(path, "rb") as f:
        for n in range(SAMPLED_ROWS + 1):
            start, line = _line_at(f, size * n // SAMPLED_ROWS, size) if n < SAMPLED_ROWS else _last_line(f, size)
            if start is not None and start in seen:
                continue
            seen.add(start)
            if start is None:  # no line starts within the window
                bad += 1
            elif line is None:
                _skip(run, f"byte {start}", f"no line end within {WINDOW_BYTES} bytes")
                bad += 1
            elif not _add_line(run, line, f"byte {start}"):
                bad += 1
            if not run.rows and bad >= MAX_BAD_SAMPLES:
                raise ValueError(f"{path}: {size / 2**20:.0f} MiB with no metrics row in the first {bad} samples: not "
                                 "a metrics.jsonl (JSON lines with a numeric 'step')")
    run.bounded = (f"{size / 2**20:.0f} MiB: {len(run.rows)} rows sampled evenly over the file (it is larger than "
                   f"{FULL_READ_BYTES >> 20} MiB)")


def _line_at(f, offset: int, size: int) -> tuple[int | None, bytes | None]:
    """(start, bytes) of the first line starting at or after ``offset``, read from at most ``WINDOW_BYTES``; bytes
    None when it does not end there (too long, or not JSON lines); start None when no line starts in the window."""
    f.seek(offset)
    block = f.read(WINDOW_BYTES)
    begin = 0
    if offset > 0:  # inside a line, or at a line's start when the byte before is a newline
        f.seek(offset - 1)
        if f.read(1) != b"\n":
            cut = block.find(b"\n")
            if cut < 0:
                return None, None
            begin = cut + 1
    end = block.find(b"\n", begin)
    if end < 0:
        return (offset + begin, block[begin:]) if offset + len(block) == size else (offset + begin, None)
    return offset + begin, block[begin:end]


def _last_line(f, size: int) -> tuple[int | None, bytes | None]:
    """(start, bytes) of the file's last non-empty line, if it starts within its last ``WINDOW_BYTES``."""
    offset = max(0, size - WINDOW_BYTES)
    f.seek(offset)
    block = f.read(WINDOW_BYTES).rstrip(b"\n")
    cut = block.rfind(b"\n")
    if cut < 0:
        return (0, block) if offset == 0 else (None, None)
    return offset + cut + 1, block[cut + 1:]


def _skip(run: Run, where: str, why: str) -> None:
    run.num_skipped += 1
    if not run.first_skipped:
        run.first_skipped = f"{where}: {why}"


def _label(path: str) -> str:
    run_dir = os.path.dirname(path)
    config = os.path.join(run_dir, "config.yaml")
    name = os.path.basename(run_dir)
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            for line in f:
                if line.strip().startswith("experiment_name:"):
                    return f"{line.split(':', 1)[1].strip()} ({name})"
    return name


def panels_for(runs: list[Run]) -> list[tuple[str, str, list[str]]]:
    """PANELS, and MOE_PANELS when a run logs router metrics."""
    moe = any(key.startswith("actor/moe/") for run in runs for key in run.keys())
    return PANELS + MOE_PANELS if moe else PANELS


def _panel_keys(run: Run, wanted: list[str]) -> list[str]:
    keys = run.keys()
    if len(wanted) == 1 and wanted[0].endswith("/"):
        return sorted(k for k in keys if k.startswith(wanted[0]))
    for key in wanted:
        if key in keys:
            return [key]
    return []


def draw(runs: list[Run], title: str | None = None):
    """The figure (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    panels = panels_for(runs)
    num_rows = math.ceil((len(panels) + 1) / 3)  # + the time panel
    fig, axes = plt.subplots(num_rows, 3, figsize=(15, 11 * num_rows / 3), constrained_layout=True)
    styles = ("-", "--", ":", "-.")
    for ax, (panel, ylabel, wanted) in zip(axes.flat, panels):
        drawn = 0
        for i, run in enumerate(runs):
            for j, key in enumerate(_panel_keys(run, wanted)):
                xs, ys = run.series(key)
                if not xs:
                    continue
                label = run.label if len(runs) > 1 else ""
                if panel.startswith("Validation"):
                    short = key.removeprefix("val-core/")
                    label = f"{label} {short}".strip()
                ax.plot(xs, ys, styles[j % len(styles)], color=COLORS[i % len(COLORS)], label=label or None,
                        marker="o" if len(xs) <= 12 else None, markersize=3, linewidth=1.4)
                drawn += 1
        _decorate(ax, panel, ylabel, drawn, wanted)
    _time_panel(axes.flat[len(panels)], runs)
    for ax in list(axes.flat)[len(panels) + 1:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _decorate(ax, panel: str, ylabel: str, drawn: int, wanted: list[str]) -> None:
    _integer_steps(ax)
    ax.set_title(panel)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if drawn == 0:
        ax.text(0.5, 0.5, "not logged\n(" + ", ".join(wanted) + ")", ha="center", va="center",
                transform=ax.transAxes, color="#888888", fontsize=9)
    elif ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


def _time_panel(ax, runs: list[Run]) -> None:
    _integer_steps(ax)
    ax.set_title("Time per step")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.grid(alpha=0.3)
    if len(runs) == 1:  # stacked by phase
        run = runs[0]
        steps = [int(r["step"]) for r in run.rows if "timing_s/step" in r]
        if not steps:
            ax.text(0.5, 0.5, "not logged (timing_s/*)", ha="center", va="center", transform=ax.transAxes,
                    color="#888888")
            return
        rows = [r for r in run.rows if "timing_s/step" in r]
        bottom = [0.0] * len(rows)
        for k, phase in enumerate(PHASES):
            values = [float(r.get(f"timing_s/{phase}") or 0.0) for r in rows]
            if not any(values):
                continue
            ax.bar(steps, values, bottom=bottom, color=COLORS[k % len(COLORS)], label=phase, width=0.8)
            bottom = [b + v for b, v in zip(bottom, values)]
        other = [max(float(r["timing_s/step"]) - b, 0.0) for r, b in zip(rows, bottom)]
        if any(o > 1e-3 for o in other):
            ax.bar(steps, other, bottom=bottom, color="#cccccc", label="other", width=0.8)
            bottom = [b + o for b, o in zip(bottom, other)]
        ax.set_ylim(0, max(bottom) * 1.45 or 1.0)  # head room for the legend above the bars
        ax.legend(fontsize=7, loc="upper center", ncol=4, framealpha=0.9)
        return
    for i, run in enumerate(runs):  # several runs: total step time, generation share dashed
        xs, ys = run.series("timing_s/step")
        if xs:
            ax.plot(xs, ys, "-", color=COLORS[i % len(COLORS)], label=f"{run.label} step")
        xs, ys = run.series("timing_s/gen")
        if xs:
            ax.plot(xs, ys, "--", color=COLORS[i % len(COLORS)], label=f"{run.label} gen")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


def summary_rows(runs: list[Run]) -> list[tuple[str, str, str, str, str]]:
    """(run, metric, first step: value, last step: value, change) for the table of the HTML page."""
    out = []
    for run in runs:
        for _, _, wanted in panels_for(runs):
            for key in _panel_keys(run, wanted):
                xs, ys = run.series(key)
                if xs:
                    out.append((run.label, key, f"{ys[0]:.4g} (step {xs[0]})", f"{ys[-1]:.4g} (step {xs[-1]})",
                                f"{ys[-1] - ys[0]:+.4g}"))
    return out


def write_html(fig, runs: list[Run], path: str, title: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prologue and doctype: the SVG is inline
    table = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in summary_rows(runs))
    sources = "".join(f"<li>{html.escape(r.label)}: <code>{html.escape(r.path)}</code> ({len(r.rows)} rows)</li>"
                      for r in runs)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}} svg{{max-width:100%;height:auto}}</style></head>
<body><h1>{html.escape(title)}</h1>
<ul>{sources}</ul>
{svg}
<h2>First and last values</h2>
<table><tr><th>run</th><th>metric</th><th>first</th><th>last</th><th>change</th></tr>
{table}
</table></body></html>
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def plot_runs(targets: list[str], out_dir: str | None = None, name: str = "curves",
              labels: list[str] | None = None) -> tuple[str, str]:
    """Draw the runs named by ``targets``; write ``<out_dir>/<name>.png`` and ``.html`` (default: the first run's
    folder). Returns the two paths."""
    paths = [p for t in targets for p in find_metrics(t)]
    if labels and len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} runs")
    runs = [load_run(p, labels[i] if labels else None) for i, p in enumerate(paths)]
    for run in runs:
        if run.bounded:
            print(f"npu-rl plot: {run.path}: {run.bounded}", file=sys.stderr)
        if run.num_skipped:
            print(f"npu-rl plot: {run.path}: skipped {run.num_skipped} line(s) that are not metrics rows (first: "
                  f"{run.first_skipped})", file=sys.stderr)
    if not any(run.rows for run in runs):
        raise ValueError("no metrics rows to plot in " + ", ".join(paths))
    out_dir = os.path.abspath(out_dir or os.path.dirname(paths[0]))
    os.makedirs(out_dir, exist_ok=True)
    title = runs[0].label if len(runs) == 1 else f"{len(runs)} runs"
    fig = draw(runs, title)
    png = os.path.join(out_dir, f"{name}.png")
    fig.savefig(png, dpi=110)
    page = write_html(fig, runs, os.path.join(out_dir, f"{name}.html"), title)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return png, page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="npu-rl plot",
        description="Training curves (reward, validation accuracy, KL, entropy, response length, clip fraction, "
                    "grad norm, throughput, time per step) from run folders' metrics.jsonl; several runs are "
                    "overlaid. Writes <name>.png and a self-contained <name>.html.")
    parser.add_argument("runs", nargs="+", help="run folders, metrics.jsonl files or trainer.default_local_dir folders")
    parser.add_argument("--out", default=None, help="folder for the pictures (default: the first run's folder)")
    parser.add_argument("--name", default="curves", help="file name without suffix (default: curves)")
    parser.add_argument("--labels", default=None, help="comma-separated legend labels, one per run")
    args = parser.parse_args(argv)
    try:
        if args.out:
            check_output_dir(args.out, "--out")  # a file in the way is said before the runs are read
        png, page = plot_runs(args.runs, args.out, args.name, args.labels.split(",") if args.labels else None)
    except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError) as exc:
        print(f"npu-rl plot: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"npu-rl plot: needs matplotlib (pip install matplotlib): {exc}", file=sys.stderr)
        return 2
    print(png)
    print(page)
    return 0
