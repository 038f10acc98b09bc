#!/usr/bin/env python3
"""The results table of scripts/kernels.sh: one column per boot, one row per suite.

usage: kernels-table.py [--readme README.md] OUT BOOT...

OUT holds, per boot, BOOT/summary.tsv (written by scripts/kernels-guest.sh in the guest:
suite, result, passed, failed, ignored, seconds, note), BOOT/wall (the boot's wall time in
seconds, QEMU included) and BOOT/package (the Debian package booted). Prints the table as
Markdown, or with --readme writes it into README.md between its kernel-matrix markers.
"""

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
    return rows, wall, package


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


def table(out, boots):
    data = {b: read_boot(out, b) for b in boots}
    suites = []
    for b in boots:
        for s in data[b][0]:
            if s not in suites:
                suites.append(s)
    lines = ["| suite | " + " | ".join(boots) + " |"]
    lines.append("| --- | " + " | ".join("---" for _ in boots) + " |")
    lines.append(
        "| kernel package | " + " | ".join(f"`{data[b][2]}`" for b in boots) + " |"
    )
    for s in suites:
        cells = []
        for b in boots:
            r = data[b][0].get(s)
            if r is not None:
                r = dict(r, suite=s)
            cells.append(cell(r))
        lines.append(f"| `{s}` | " + " | ".join(cells) + " |")
    lines.append(
        "| boot wall time (QEMU, TCG) | "
        + " | ".join(fmt_secs(data[b][1]) for b in boots)
        + " |"
    )
    return "\n".join(lines) + "\n"


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
    _, tail = rest.split(END, 1)
    readme.write_text(head + START + "\n" + text + END + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
