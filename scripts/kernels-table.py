#!/usr/bin/env python3
"""The results table of scripts/kernels.sh: one column per boot, one row per suite.

usage: kernels-table.py [--readme README.md] OUT BOOT...

OUT holds, per boot, BOOT/summary.tsv (written by scripts/kernels-guest.sh in the guest:
suite, result, passed, failed, ignored, seconds, note), BOOT/wall (the boot's wall time in
seconds, QEMU included) and BOOT/package (the Debian package booted). Prints the table as
Markdown, or with --readme writes it into README.md between its kernel-matrix markers. There
the columns of these boots replace theirs, and the table's other columns stay as they are:
a run of some boots updates only those. The "results" row says which run (its directory, and
when the boot ended) each column comes from.
"""

import datetime
import sys
from pathlib import Path

START = "<!-- kernels.sh table: start -->"
END = "<!-- kernels.sh table: end -->"


def read_boot(out, boot):
    d = out / boot
    rows = {}
    summary = d / "summary.tsv"
    if summary.exists():
        for line in summary.read_text().splitlines():
            f = line.split("\t")
            if len(f) < 6:
                continue
            rows[f[0]] = {
                "result": f[1],
                "passed": f[2],
                "failed": f[3],
                "ignored": f[4],
                "secs": f[5],
                "note": f[6] if len(f) > 6 else "",
            }
    wall = (d / "wall").read_text().strip() if (d / "wall").exists() else "?"
    package = (d / "package").read_text().strip() if (d / "package").exists() else "?"
    run = f"`{out.resolve().name}`"
    if (d / "wall").exists():
        ended = datetime.datetime.fromtimestamp(
            (d / "wall").stat().st_mtime, datetime.timezone.utc
        )
        run += ended.strftime(", %Y-%m-%d %H:%M UTC")
    return rows, wall, package, run


def cell(r):
    if r is None:
        return "–"
    if r["suite"] == "first-add" and r["result"] == "passed":
        # The note says it all: both ADDs' times and the module loading of the first.
        return "✓ " + r["note"].replace("exit 0; ", "").replace(" (exit 0)", "")
    mark = "✓" if r["result"] == "passed" else "✗"
    counts = r["passed"]
    if r["failed"] != "0":
        counts += f" / {r['failed']} failed"
    text = f"{mark} {counts}, {fmt_secs(r['secs'])}"
    if ":" not in r["suite"] or r["result"] != "passed":
        if r["note"] and not r["note"].startswith("exit 0"):
            text += f" ({r['note']})"
    return text


def fmt_secs(s):
    try:
        v = float(s)
    except ValueError:
        return s
    return f"{v:.0f} s" if v < 120 else f"{v / 60:.1f} min"


PACKAGE = "kernel package"
RESULTS = "results"
WALL = "boot wall time (QEMU, TCG)"


def grid(out, boots):
    """The table as (boots, row labels, {(label, boot): cell})."""
    data = {b: read_boot(out, b) for b in boots}
    suites = []
    for b in boots:
        for s in data[b][0]:
            if s not in suites:
                suites.append(s)
    cells = {}
    for b in boots:
        rows, wall, package, run = data[b]
        cells[(PACKAGE, b)] = f"`{package}`"
        cells[(RESULTS, b)] = run
        cells[(WALL, b)] = fmt_secs(wall)
        for s in suites:
            r = rows.get(s)
            cells[(f"`{s}`", b)] = cell(None if r is None else dict(r, suite=s))
    labels = [PACKAGE, RESULTS] + [f"`{s}`" for s in suites] + [WALL]
    return list(boots), labels, cells


def render(boots, labels, cells):
    lines = ["| suite | " + " | ".join(boots) + " |"]
    lines.append("| --- | " + " | ".join("---" for _ in boots) + " |")
    for label in labels:
        row = [cells.get((label, b), "–") for b in boots]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def table(out, boots):
    return render(*grid(out, boots))


def parse(text):
    """A table as render writes it, back as (boots, row labels, cells)."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split(" | ")]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    if len(rows) < 2:
        return [], [], {}
    boots = rows[0][1:]
    labels, cells = [], {}
    for row in rows[2:]:
        labels.append(row[0])
        for b, c in zip(boots, row[1:]):
            cells[(row[0], b)] = c
    return boots, labels, cells


def merged(old, new):
    """`old`'s table with `new`'s boots replacing (or added to) its columns."""
    old_boots, old_labels, old_cells = old
    new_boots, new_labels, new_cells = new
    boots = old_boots + [b for b in new_boots if b not in old_boots]
    labels = list(old_labels)
    for label in new_labels:
        if label in labels:
            continue
        # New rows go before the wall time (the last row), or after the row before them.
        at = new_labels.index(label)
        before = next((l for l in reversed(new_labels[:at]) if l in labels), None)
        if label == WALL or before is None:
            labels.append(label)
        else:
            labels.insert(labels.index(before) + 1, label)
    if WALL in labels:
        labels.remove(WALL)
        labels.append(WALL)
    cells = {k: v for k, v in old_cells.items() if k[1] not in new_boots}
    cells.update(new_cells)
    return boots, labels, cells


def main(argv):
    readme = None
    if len(argv) > 1 and argv[0] == "--readme":
        readme, argv = Path(argv[1]), argv[2:]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, boots = Path(argv[0]), argv[1:]
    text = table(out, boots)
    if readme is None:
        sys.stdout.write(text)
        return 0
    body = readme.read_text()
    if START not in body or END not in body:
        print(f"error: {readme} has no {START} … {END} markers", file=sys.stderr)
        return 1
    head, rest = body.split(START, 1)
    current, tail = rest.split(END, 1)
    text = render(*merged(parse(current), grid(out, boots)))
    readme.write_text(head + START + "\n" + text + END + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
