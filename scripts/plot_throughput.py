"""Draw the throughput benchmark's result as a bar chart of output tokens/s per contender, with
the bandwidth floor as a line (docs/images/throughput.png in docs/benchmarks.md).

Usage: .venv/bin/python scripts/plot_throughput.py THROUGHPUT_JSON [OUT_PNG]
THROUGHPUT_JSON is the last line `benchmarks/throughput.py` prints (a file holding that line, or
the whole log: the last line that parses as JSON is taken). Needs the `plots` extra
(`pip install -e '.[plots]'`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LABELS = {
    "runner_v2": "runner_v2",
    "runner_v2-unfused": "runner_v2, unfused ops",
    "runner_v2-serial": "runner_v2, serial attention",
    "runner_v1": "runner_v1",
    "hf_generate_compiled": "HF generate, compiled",
    "hf_generate": "HF generate, eager",
}


def load_summary(path: Path) -> dict:
    """The last line of ``path`` that parses as a JSON object.

    Raises:
        SystemExit: ``path`` cannot be read, or no line of it is a JSON object.
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"{path}: cannot read it ({exc})") from None
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise SystemExit(
        f"{path}: no line is a JSON object (give the last line benchmarks/throughput.py prints)"
    )


def drawable_results(summary: dict) -> dict:
    """The contenders of ``summary`` that ran (they have ``output_tokens_per_s``).

    Raises:
        SystemExit: ``summary`` has no ``results`` object, or no contender ran (the errors
            named): nothing is drawn, so no chart replaces a good one with an empty one.
    """
    results = summary.get("results")
    if not isinstance(results, dict):
        raise SystemExit(
            "the summary has no 'results' object (give the last line benchmarks/throughput.py prints)"
        )
    ran = {k: v for k, v in results.items() if isinstance(v, dict) and "output_tokens_per_s" in v}
    if not ran:
        errors = "; ".join(
            f"{k}: {v.get('error', v) if isinstance(v, dict) else v}" for k, v in results.items()
        )
        raise SystemExit(f"no contender ran, nothing to draw ({errors or 'no contenders'})")
    return ran


def plot(summary: dict, out: Path) -> None:
    results = drawable_results(summary)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    names = sorted(results, key=lambda k: results[k]["output_tokens_per_s"])
    speeds = [results[k]["output_tokens_per_s"] for k in names]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.6))
    bars = ax.barh([LABELS.get(n, n) for n in names], speeds, color="#3b6ea8")
    ax.bar_label(bars, labels=[f"{s:,.0f}" for s in speeds], padding=4)
    floor = summary.get("bandwidth_floor", {}).get("output_tokens_per_s")
    if floor:
        ax.axvline(floor, color="#b03a2e", linestyle="--", linewidth=1)
        # At the top of the axes (x in data, y in axes units): clear of the bars and the ticks.
        ax.text(
            floor,
            0.98,
            f"bandwidth floor {floor:,.0f} ",
            color="#b03a2e",
            va="top",
            ha="right",
            transform=ax.get_xaxis_transform(),
        )
    ax.set_xlabel("output tokens/s")
    ax.xaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    ax.set_xlim(0, max([*speeds, floor or 0]) * 1.25)
    ax.set_title(
        f"{summary.get('model', '')}, {summary.get('num_prompts')} prompts x "
        f"{summary.get('output_len')} tokens, {summary.get('device', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> None:
    if not argv or len(argv) > 2:
        raise SystemExit(__doc__)
    out = Path(argv[1]) if len(argv) == 2 else Path("docs/images/throughput.png")
    plot(load_summary(Path(argv[0])), out)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
