"""Soak the real window: a five-lane race every interval for a given time, idle in between, measuring what a crash
would hide: exit status, resident memory after every race, the process's CPU use while idle, and Python's reference
counts of None and True (PySide6 6.12.0 on Python 3.11 drains them until the process aborts).

    python tests/soak_window.py --minutes 30 --every 60              # offscreen
    xvfb-run -s "-screen 0 1600x1000x24" env QT_QPA_PLATFORM=xcb python tests/soak_window.py --minutes 30

Prints one line per race and a summary; exits 1 when idle CPU or memory growth break the limits, 0 otherwise.
Not collected by pytest (it runs for minutes); the README's test section quotes its last run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

IDLE_SETTLE_S = 5.0  # idle CPU is measured from this long after a race ends until the next race starts


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every", type=float, default=60.0, help="seconds from one race's start to the next")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--max-idle-cpu", type=float, default=1.0, help="percent of one core")
    ap.add_argument("--max-growth-mb", type=float, default=150.0, help="RSS growth from the second race to the last")
    ap.add_argument("--out", type=Path, default=None, help="write every measurement as JSON lines here")
    args = ap.parse_args()

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import asyncio

    import qasync
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from engine.registry import DRAFTERS

    app = QApplication.instance() or QApplication(sys.argv)
    loop = qasync.QEventLoop(app)  # the event loop the app itself runs on (main.launch)
    asyncio.set_event_loop(loop)
    work = Path(tempfile.mkdtemp(prefix="glance-soak-"))
    settings = QSettings(str(work / "settings.ini"), QSettings.Format.IniFormat)
    settings.setValue("max_new", args.max_new)
    settings.setValue("methods", ",".join(s.name for s in DRAFTERS if s.in_default_race))
    window = MainWindow(settings=settings, autosave_dir=work / "autosave")
    window.resize(1600, 1000)
    window.show()

    with loop:
        return loop.run_until_complete(soak(args, app, window))


async def wait(seconds: float, until=None) -> None:
    """Let the event loop run for `seconds`, or until `until()` holds (checked twice a second)."""
    import asyncio

    end = time.monotonic() + seconds
    while time.monotonic() < end and not (until and until()):
        await asyncio.sleep(min(0.5, max(0.0, end - time.monotonic())) if until else end - time.monotonic())


async def soak(args, app, window) -> int:
    from engine.registry import DRAFTERS

    lanes = sum(s.in_default_race for s in DRAFTERS)
    await wait(600, until=lambda: window.job is None)
    if window.models is None:
        print(f"load failed: {window.banner.text()}")
        return 2
    out = args.out.open("w") if args.out else None
    start, rows = time.monotonic(), []
    print(f"soak: {args.minutes:g} min, a {lanes}-lane race of {args.max_new} tokens every {args.every:g} s")
    while time.monotonic() - start < args.minutes * 60:
        race_start = time.monotonic()
        window.race()
        await wait(600, until=lambda: window.job is None)
        race_s = time.monotonic() - race_start
        await wait(IDLE_SETTLE_S)
        idle_wall, idle_cpu = time.monotonic(), cpu_seconds()
        await wait(max(1.0, args.every - (time.monotonic() - race_start)))
        idle_pct = 100 * (cpu_seconds() - idle_cpu) / (time.monotonic() - idle_wall)
        lanes = {n: lane.stats.new_tokens for n, lane in window.lanes.items()}
        row = dict(
            race=len(rows) + 1,
            minute=round((time.monotonic() - start) / 60, 2),
            race_s=round(race_s, 2),
            tokens=lanes,
            rss_mb=round(rss_mb(), 1),
            idle_cpu_pct=round(idle_pct, 3),
            none_refs=sys.getrefcount(None),
            true_refs=sys.getrefcount(True),
            banner=window.banner.text() if window.banner.isVisible() else "",
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
    window.close()
    app.processEvents()

    idle = [r["idle_cpu_pct"] for r in rows]
    growth = rows[-1]["rss_mb"] - rows[min(1, len(rows) - 1)]["rss_mb"]
    complete = all(all(v >= args.max_new for v in r["tokens"].values()) for r in rows)
    summary = dict(
        races=len(rows),
        minutes=round((time.monotonic() - start) / 60, 1),
        every_race_complete=complete,
        rss_first_mb=rows[0]["rss_mb"],
        rss_last_mb=rows[-1]["rss_mb"],
        rss_max_mb=max(r["rss_mb"] for r in rows),
        rss_growth_after_first_mb=round(growth, 1),
        idle_cpu_pct_mean=round(sum(idle) / len(idle), 3),
        idle_cpu_pct_max=max(idle),
        none_refs=(rows[0]["none_refs"], rows[-1]["none_refs"]),
        true_refs=(rows[0]["true_refs"], rows[-1]["true_refs"]),
        platform=os.environ.get("QT_QPA_PLATFORM"),
        python=sys.version.split()[0],
    )
    print("summary " + json.dumps(summary), flush=True)
    ok = complete and max(idle) < args.max_idle_cpu and growth < args.max_growth_mb
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
