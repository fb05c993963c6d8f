"""A shadow evaluation's report for people: a terminal table and an HTML page with a plot of
where decisions differ over the step range (matplotlib, Agg backend, the PNG embedded)."""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

__all__ = ["plot_png", "render_html", "render_text"]


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


def _hash8(h: str | None) -> str:
    from broker_schema.canonical import hex_of_hash, is_hash

    return "-" if not h else (hex_of_hash(h)[:8] if is_hash(h) else h[:8])


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The headline figures, one per line."""
    models = ", ".join(f"{n} -> {_hash8(h)}" for n, h in sorted(report["models"].items()))
    lines = [
        f"shadow evaluation {report['eval_id']} of workload {report['workload_id']} "
        f"({report['mode']}): {models}",
        f"steps {report['from_seq']}..{report['to_seq']}: {report['steps']} folded, "
        f"{report['decisions']} decisions compared",
        f"requests re-issued: {report['requests']} ({report['answered']} answered: "
        f"{_short(report['shadow_outcomes'])}); answers that differ: {report['outputs_differ']} "
        f"(label changes: {report['label_changes']}, other outcomes: "
        f"{sum(1 for r in report['per_request'] if r['outcome'][0] != r['outcome'][1])})",
        f"decisions that differ: {report['decisions_differ']}"
        + (f" (and {report['decisions_renamed_only']} that differ only in the model hash they "
           "name)" if report["decisions_renamed_only"] else ""),
    ]
    first = report["first_differing"]
    if first is not None:
        lines.append(f"first differing decision: step {first['seq']} index {first['index']} "
                     f"(.out@{first['out_offset']}), fields {', '.join(first['fields']) or '-'}")
    if report["requests_diverged_at"] is not None:
        lines.append(f"requests diverged at step {report['requests_diverged_at']}: "
                     f"{report['divergence']}")
    t = report["topics"]
    lines.append(f"records: {t['eval']} (definition, report), {t['out']} "
                 f"({report['requests_written']} requests), {t['resp']} (answers)")
    lines.append(f"report_hash {report['report_hash']}")
    return lines


def _label_changed(row: dict[str, Any]) -> bool:
    return "label" in row and row["label"][0] != row["label"][1]


def render_text(report: dict[str, Any], *, rows: int = 20) -> str:
    """The summary, then the first ``rows`` differing decisions and output differences."""
    lines = summary_lines(report)
    diffs = report["differing"]
    if diffs:
        lines += ["", f"differing decisions ({len(diffs)}; first {min(rows, len(diffs))}):",
                  f"  {'step':>6} {'idx':>3}  {'recorded':40}  shadow"]
        for d in diffs[:rows]:
            rec, new = d["recorded"], d["shadow"]
            if isinstance(rec, dict) and isinstance(new, dict) and d["fields"]:
                rec = {k: rec.get(k) for k in d["fields"]}
                new = {k: new.get(k) for k in d["fields"]}
            lines.append(f"  {d['seq']:>6} {d['index']:>3}  {_short(rec, 40):40}  "
                         f"{_short(new, 40)}")
    changed = sorted((r for r in report["per_request"] if not r["same"]),
                     key=lambda r: (not _label_changed(r), r["outcome"][0] == r["outcome"][1],
                                    r["seq"], r["index"]))
    if changed:
        lines += ["", f"answers that differ ({len(changed)} of {len(report['per_request'])}, "
                  "label changes and other outcomes first; "
                  f"first {min(rows, len(changed))}):",
                  f"  {'step':>6} {'idx':>3}  {'outcome':18} {'label':24} {'score':>17}  tokens"]
        for r in changed[:rows]:
            label = "/".join(str(x) for x in r.get("label", ["", ""]))
            score = ("" if "score" not in r else
                     f"{r['score'][0]:.3f}->{r['score'][1]:.3f}")
            tok = r.get("tokens")
            tokens = "" if tok is None else (f"first diff at {tok['first_diff']}, "
                                             f"{tok['differ']} differ")
            lines.append(f"  {r['seq']:>6} {r['index']:>3}  {'/'.join(map(str, r['outcome'])):18} "
                         f"{label:24} {score:>17}  {tokens}")
    return "\n".join(lines)


def plot_png(report: dict[str, Any]) -> bytes:
    """A PNG: over the step range, the steps whose decision differs, those whose model answer
    differs (label change or other), and where requests diverged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo, hi = report["from_seq"], report["to_seq"]
    fig, ax = plt.subplots(figsize=(10, 3.6), dpi=100)
    rows = report["per_request"]
    same = [r["seq"] for r in rows if r["same"]]
    label = [r["seq"] for r in rows if _label_changed(r) or r["outcome"][0] != r["outcome"][1]]
    other = [r["seq"] for r in rows if not r["same"] and not _label_changed(r)
             and r["outcome"][0] == r["outcome"][1]]
    decision_steps = [d["seq"] for d in report["differing"]]
    ax.scatter(same, [0] * len(same), marker="|", s=60, color="#999999",
               label=f"answer the same ({len(same)})")
    ax.scatter(other, [1] * len(other), marker="|", s=60, color="#56b4e9",
               label=f"answer differs, same label or outcome ({len(other)})")
    ax.scatter(label, [2] * len(label), marker="|", s=140, color="#e69f00",
               label=f"label or outcome changes ({len(label)})")
    ax.scatter(decision_steps, [3] * len(decision_steps), marker="|", s=160, color="#d55e00",
               label=f"decision differs ({len(decision_steps)})")
    if report["requests_diverged_at"] is not None:
        ax.axvline(report["requests_diverged_at"], color="#0072b2", linestyle="--",
                   label=f"requests diverge (step {report['requests_diverged_at']})")
    ax.set_yticks([0, 1, 2, 3], ["same", "score only", "label", "decision"])
    ax.set_ylim(-0.7, 3.7)
    ax.set_xlim(lo - 0.5, hi + 0.5)
    ax.set_xlabel("step (input offset on the merge log)")
    models = ", ".join(f"{n} → {_hash8(h)}" for n, h in sorted(report["models"].items()))
    ax.set_title(f"shadow {report['eval_id']} of {report['workload_id']}: {models}",
                 fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, fontsize=8,
              frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def render_html(report: dict[str, Any], *, rows: int = 200) -> str:
    """A self-contained HTML page: the summary, the plot (PNG, base64), the differing decisions
    and the answers that differ (first ``rows`` of each)."""
    png = base64.b64encode(plot_png(report)).decode()
    esc = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             f"<title>shadow {esc(report['eval_id'])}</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
             "padding:3px 6px;text-align:left;vertical-align:top}code{font-size:12px}</style>",
             "</head><body>", f"<h1>Shadow evaluation {esc(report['eval_id'])}</h1><ul>"]
    parts += [f"<li>{esc(line)}</li>" for line in summary_lines(report)]
    parts.append("</ul>")
    parts.append(f"<img alt='where decisions differ' src='data:image/png;base64,{png}'>")
    diffs = report["differing"]
    parts.append(f"<h2>Differing decisions ({len(diffs)})</h2>")
    if diffs:
        parts.append("<table><tr><th>step</th><th>index</th><th>.out offset</th>"
                     "<th>fields</th><th>recorded</th><th>shadow</th></tr>")
        for d in diffs[:rows]:
            parts.append(f"<tr><td>{d['seq']}</td><td>{d['index']}</td><td>{d['out_offset']}"
                         f"</td><td>{esc(', '.join(d['fields']))}</td>"
                         f"<td><code>{esc(json.dumps(d['recorded'], sort_keys=True))}</code></td>"
                         f"<td><code>{esc(json.dumps(d['shadow'], sort_keys=True))}</code></td>"
                         "</tr>")
        parts.append("</table>")
    changed = sorted((r for r in report["per_request"] if not r["same"]),
                     key=lambda r: (not _label_changed(r), r["seq"], r["index"]))
    parts.append(f"<h2>Answers that differ ({len(changed)} of {len(report['per_request'])})</h2>")
    if changed:
        parts.append("<table><tr><th>step</th><th>effect id</th><th>outcome</th><th>label</th>"
                     "<th>score (delta)</th><th>tokens</th><th>shadow .resp offset</th></tr>")
        for r in changed[:rows]:
            label = " → ".join(str(x) for x in r.get("label", []))
            score = ("" if "score" not in r else
                     f"{r['score'][0]:.4f} → {r['score'][1]:.4f} ({r['score_delta']:+.4f})")
            tok = r.get("tokens")
            tokens = "" if tok is None else esc(json.dumps(tok))
            parts.append(f"<tr><td>{r['seq']}</td><td><code>{esc(r['effect_id'])}</code></td>"
                         f"<td>{esc(' → '.join(map(str, r['outcome'])))}</td>"
                         f"<td>{esc(label)}</td><td>{score}</td><td>{tokens}</td>"
                         f"<td>{r['shadow_resp_offset']}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)
