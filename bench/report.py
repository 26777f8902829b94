"""Run benchmark scripts one after another and collect their tables in a dated markdown file.

    .venv/bin/python bench/report.py [--out FILE] [--quick] agent_desktop.py api.py ...

Each script (a file in bench/, run from the repository root with this Python) prints its
tables in markdown on stdout, which is captured; its progress on stderr goes straight to the
terminal. The report (default ``bench/results/YYYY-MM-DD.md``, or ``-HHMM`` added when that
exists) gets, per script, the exact command, its exit status, duration and the host's load,
then its output. It is rewritten after every script, so an interrupted run keeps what
finished. A failing script is recorded and the next one runs. ``--quick`` gives each known
script small sizes, to check the pipeline, not to measure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
# Small sizes per script for --quick (checks that everything runs; the figures mean little).
QUICK: dict[str, list[str]] = {
    "api.py": ["--creates", "1", "--iterations", "10", "--idle-s", "1"],
    "vnc.py": ["--runs", "1", "--frames", "3", "--seconds", "1"],
    "state.py": ["--cycles", "3", "--hibernations", "1"],
    "container_start.py": ["--runs", "2"],
    "peers.py": ["--iterations", "10"],
    "startup.py": ["--runs", "2"],
    "density.py": ["--steps", "1,3", "--iterations", "10", "--idle-s", "3"],
    "load.py": ["--clients", "4", "--actions", "20", "--sessions", "2"],
    "agent_protocol.py": ["--calls", "50"],
    "agent_desktop.py": ["--iterations", "20", "--clicks", "100"],
    "agent_live.py": ["--runs", "2", "--frames", "3", "--evals", "20"],
    "exec.py": ["--iterations", "20"],
    "server_cpu.py": ["--actions", "100"],
    "click_layers.py": ["--iterations", "20", "--cold-reps", "1"],
    "rl.py": ["--resets", "4", "--envs", "1,4"],
    "volumes.py": ["--runs", "2"],
    "recording.py": ["--rounds", "1", "--iterations", "10"],
    "settle_busy.py": ["--clicks", "10"],
    "listing.py": ["--ended", "2000", "--clicks", "40"],
    "soak.py": ["--cycles", "3", "--every", "1"],
}


def progress(message: str) -> None:
    print(f"[report] {message}", file=sys.stderr, flush=True)


@dataclass
class Outcome:
    script: str
    argv: list[str]
    status: str
    seconds: float
    load: tuple[float, float]
    output: str


class Runner:
    """Runs one script at a time; SIGTERM is passed on to it so it can clean up."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[str] | None = None
        self.stopping = False
        signal.signal(signal.SIGTERM, self._forward)

    def _forward(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.child is not None:
            self.child.send_signal(signal.SIGTERM)

    def run(self, script: str, args: Sequence[str]) -> Outcome:
        argv = [sys.executable, f"bench/{script}", *args]
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        self.child = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            output, _ = self.child.communicate()
        except KeyboardInterrupt:
            # The script got the Ctrl-C too (same process group): let it clean up.
            output, _ = self.child.communicate()
            self.stopping = True
        code = self.child.returncode
        self.child = None
        status = "ok" if code == 0 else f"failed (exit status {code})"
        return Outcome(script, argv, status, time.monotonic() - started,
                       (load_before, os.getloadavg()[0]), output)


def report_path(out: Path | None, now: dt.datetime) -> Path:
    if out is not None:
        return out
    path = RESULTS / f"{now:%Y-%m-%d}.md"
    return path if not path.exists() else RESULTS / f"{now:%Y-%m-%d-%H%M}.md"


def _command(argv: Sequence[str]) -> str:
    return " ".join([".venv/bin/python", *argv[1:]])


def render(now: dt.datetime, outcomes: Sequence[Outcome], pending: Sequence[str]) -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines = [
        f"# Deskbox benchmarks, {now:%Y-%m-%d %H:%M}",
        "",
        f"Host: {os.cpu_count()} CPUs, {memory:.0f} GiB, {platform.system()}"
        f" {platform.release()}, Python {platform.python_version()}. The load averages"
        " below are the host's 1-minute figures: other work on the host skews the results.",
        "",
    ]
    for outcome in outcomes:
        output = outcome.output.strip() or "(no output)"
        if "|" not in output and not output.startswith("#"):
            output = f"```text\n{output}\n```"  # a script that prints plain text
        else:  # its headings go one level under this script's
            output = "\n".join("#" + line if line.startswith("#") else line
                                for line in output.splitlines())
        lines += [
            f"## bench/{outcome.script}",
            "",
            f"`{_command(outcome.argv)}`: {outcome.status}, {outcome.seconds:.0f} s, load"
            f" {outcome.load[0]:.2f} → {outcome.load[1]:.2f}.",
            "",
            output,
            "",
        ]
    if pending:
        lines += [f"Not run (yet, or interrupted): {', '.join(pending)}.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("scripts", nargs="+", help="file names in bench/, e.g. api.py")
    parser.add_argument("--out", type=Path, help="default bench/results/YYYY-MM-DD.md")
    parser.add_argument("--quick", action="store_true", help="small sizes (a pipeline check)")
    args = parser.parse_args(argv)
    missing = [s for s in args.scripts if not (BENCH / s).is_file()]
    if missing:
        parser.error(f"not in bench/: {', '.join(missing)}")
    now = dt.datetime.now()
    path = report_path(args.out, now)
    path.parent.mkdir(parents=True, exist_ok=True)
    runner = Runner()
    outcomes: list[Outcome] = []
    for index, script in enumerate(args.scripts):
        if runner.stopping:
            break
        progress(f"{index + 1}/{len(args.scripts)} bench/{script} ...")
        outcome = runner.run(script, QUICK.get(script, []) if args.quick else [])
        outcomes.append(outcome)
        progress(f"bench/{script}: {outcome.status} in {outcome.seconds:.0f} s")
        path.write_text(render(now, outcomes, args.scripts[index + 1:]), encoding="utf-8")
    print(path.read_text(encoding="utf-8"))
    progress(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0 if all(o.status == "ok" for o in outcomes) and not runner.stopping else 1


if __name__ == "__main__":
    sys.exit(main())
