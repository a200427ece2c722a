"""Reports of tools/gpu_suite.sh (stdlib only).

    python tools/gpu_suite_report.py junit RESULTS.xml OUT.json OUT.md       # a pytest run, as JSON and markdown
    python tools/gpu_suite_report.py summary STEPS.tsv OUT.json OUT.md       # exit code and seconds per step

STEPS.tsv: one line per step, ``name<TAB>exit code<TAB>seconds<TAB>timeout seconds<TAB>files``.
"""

from __future__ import annotations

import json
import platform
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def junit(xml_path: Path, json_path: Path, md_path: Path) -> int:
    if not xml_path.exists():
        md_path.write_text(f"no pytest report ({xml_path.name} missing: pytest did not finish)\n")
        json_path.write_text(json.dumps({"error": "no junit report"}))
        return 0
    root = ET.parse(xml_path).getroot()
    cases = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = (el.get("message") or "").splitlines()[0][:300] if el.get("message") else ""
                break
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0), "message": message})
    counts = {k: sum(1 for c in cases if c["outcome"] == k) for k in ("passed", "failed", "error", "skipped")}
    json_path.write_text(json.dumps({"counts": counts, "cases": cases}, indent=1))
    lines = [f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
             f"{counts['skipped']} skipped", "", "| test | outcome | s | message |", "|---|---|---|---|"]
    lines += [f"| {c['test']} | {c['outcome']} | {c['seconds']:.2f} | {c['message'].replace('|', '/')} |"
              for c in cases]
    md_path.write_text("\n".join(lines) + "\n")
    return 0


def summary(tsv: Path, json_path: Path, md_path: Path) -> int:
    steps = []
    for line in tsv.read_text().splitlines():
        if not line.strip():
            continue
        name, rc, seconds, limit, files = (line.split("\t") + [""] * 5)[:5]
        rc_i = int(rc)
        present = sorted(p.name for p in json_path.parent.glob(f"{name}.*"))
        steps.append({"step": name, "exit_code": rc_i, "seconds": round(float(seconds), 1), "limit_s": int(limit),
                      "timed_out": rc_i in (124, 137), "files": present or [f for f in files.split(",") if f]})
    ok = all(s["exit_code"] == 0 for s in steps)
    total = sum(s["seconds"] for s in steps)
    json_path.write_text(json.dumps({"ok": ok, "total_s": round(total, 1), "host": platform.node(),
                                     "steps": steps}, indent=1))
    lines = ["| step | exit code | seconds | limit s | files |", "|---|---|---|---|---|"]
    lines += [f"| {s['step']} | {s['exit_code']}{' (timed out)' if s['timed_out'] else ''} | {s['seconds']:.1f} | "
              f"{s['limit_s']} | {', '.join(s['files'])} |" for s in steps]
    lines.append(f"| total | {'ok' if ok else 'FAILED'} | {total:.1f} | | |")
    md_path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("junit", "summary"):
        print(__doc__, file=sys.stderr)
        return 2
    fn = junit if argv[0] == "junit" else summary
    return fn(Path(argv[1]), Path(argv[2]), Path(argv[3]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
