"""A few Prometheus metrics, rendered in the text exposition format (version 0.0.4).

Updated from the event loop only, so no locks. ``GET /metrics`` renders them.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

__all__ = ["Counter", "Histogram", "Metrics"]

Labels = tuple[str, ...]
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Labels, values: Labels, extra: str = "") -> str:
    parts = [f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Counter:
    def __init__(self, name: str, help_text: str, label_names: Labels = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, label_names
        self._values: dict[Labels, float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, *labels: str) -> float:
        return self._values.get(labels, 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for labels, value in sorted(self._values.items()):
            lines.append(f"{self.name}{_labels(self.label_names, labels)} {_number(value)}")
        return lines


class Histogram:
    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Labels = (),
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> None:
        self.name, self.help, self.label_names, self.buckets = name, help_text, label_names, buckets
        self._counts: dict[Labels, list[int]] = {}
        self._sums: dict[Labels, float] = {}

    def observe(self, value: float, *labels: str) -> None:
        counts = self._counts.setdefault(labels, [0] * (len(self.buckets) + 1))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self._sums[labels] = self._sums.get(labels, 0.0) + value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for labels, counts in sorted(self._counts.items()):
            cumulative = 0
            for bound, count in zip((*self.buckets, float("inf")), counts, strict=True):
                cumulative += count
                le = "+Inf" if bound == float("inf") else repr(bound)
                label_text = _labels(self.label_names, labels, f'le="{le}"')
                lines.append(f"{self.name}_bucket{label_text} {cumulative}")
            label_text = _labels(self.label_names, labels)
            lines.append(f"{self.name}_sum{label_text} {_number(self._sums[labels])}")
            lines.append(f"{self.name}_count{label_text} {cumulative}")
        return lines


class Metrics:
    """The server's metrics; sessions by state are read from the manager at render time."""

    def __init__(self) -> None:
        self.actions = Counter(
            "deskbox_actions_total", "Actions run, by action type and outcome.", ("type", "outcome")
        )
        self.action_seconds = Histogram(
            "deskbox_action_duration_seconds",
            "Time to run one action request (a batch counts once), by first action type.",
            ("type",),
        )
        self.screenshots = Counter(
            "deskbox_screenshots_total", "Screenshots taken, by image format.", ("format",)
        )
        self.errors = Counter(
            "deskbox_errors_total", "Error responses, by error type.", ("type",)
        )
        self.execs = Counter(
            "deskbox_exec_total",
            "Commands run in sessions, by outcome (exited, timed_out, background, "
            "client_left: killed as their client disconnected).",
            ("outcome",),
        )
        self.file_bytes = Counter(
            "deskbox_file_bytes_total",
            "Bytes moved by the files endpoint, by direction (upload, download).",
            ("direction",),
        )
        self.slow_clients = Counter(
            "deskbox_slow_clients_dropped_total",
            "Clients dropped for not taking what was sent to them, by stream (actions, vnc, "
            "cdp, download), or for not sending a whole request head in time (request_head).",
            ("stream",),
        )

    def render(
        self, sessions_by_state: Mapping[str, int], pool_ready: Mapping[str, int] | None = None
    ) -> str:
        lines = [
            "# HELP deskbox_sessions Sessions known to the server, by state.",
            "# TYPE deskbox_sessions gauge",
        ]
        for state, count in sorted(sessions_by_state.items()):
            lines.append(f'deskbox_sessions{{state="{_escape(state)}"}} {count}')
        if pool_ready is not None:
            lines += [
                "# HELP deskbox_pool_ready Ready desktops in the warm pool, by display size.",
                "# TYPE deskbox_pool_ready gauge",
            ]
            for display, count in sorted(pool_ready.items()):
                lines.append(f'deskbox_pool_ready{{display="{_escape(display)}"}} {count}')
        for metric in (
            self.actions, self.action_seconds, self.screenshots, self.errors, self.execs,
            self.file_bytes, self.slow_clients,
        ):
            lines += metric.render()
        return "\n".join(lines) + "\n"
