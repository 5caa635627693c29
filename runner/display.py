"""What the user sees during and after `vf-sandbox eval`: a rich live view
(multi-env overview + detail panel with recent logs), plain log lines with
`-d`, and the summary tables at the end."""

from __future__ import annotations

import collections
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from envs.errors import error_text
from envs.logging_utils import for_console

log = logging.getLogger("envs.runner")


@dataclass
class EvalProgress:
    """Live counters for one eval (updated per completed group)."""

    label: str
    model: str
    total: int = 0
    done: int = 0
    resumed: int = 0
    errors: int = 0
    infra: int = 0  # rollouts not scored (model / sandbox / env / usage error): not in the average
    reward_sum: float = 0.0
    status: str = "pending"
    started: float = field(default_factory=time.time)
    output: str = ""
    logs: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=8))

    @property
    def avg_reward(self) -> float:
        scored = self.done - self.infra
        return self.reward_sum / scored if scored > 0 else 0.0

    @property
    def rate(self) -> float:
        elapsed = time.time() - self.started
        return (self.done - self.resumed) / elapsed if elapsed > 0 else 0.0


class _LogTap(logging.Handler):
    """Routes log records into the live view's per-eval log panel."""

    def __init__(self, display: "RichDisplay"):
        super().__init__(logging.INFO)
        self.display = display

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.display.add_log(self.format(record))
        except Exception:
            pass


class PlainDisplay:
    """`-d`: normal logging, one progress line per eval every few seconds."""

    def __init__(self, interval: float = 2.0):
        self.evals: list[EvalProgress] = []
        self.interval = interval
        self._last: dict[int, float] = {}

    def __enter__(self) -> "PlainDisplay":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def add(self, progress: EvalProgress) -> int:
        self.evals.append(progress)
        return len(self.evals) - 1

    def update(self, idx: int) -> None:
        p = self.evals[idx]
        if p.status == "pending":
            return
        now = time.monotonic()
        if p.done < p.total and now - self._last.get(idx, 0) < self.interval:
            return
        self._last[idx] = now
        log.info("%s: %d/%d rollouts, avg reward %.3f, errors %d, %.1f rollouts/s", p.label, p.done, p.total, p.avg_reward, p.errors, p.rate)

    def add_log(self, line: str) -> None:
        pass

    def add_rows(self, idx: int, rows: list[dict[str, Any]]) -> None:
        """A group of eval `idx` finished with these rows (a hook for per-row views)."""


class _ArrowKeys:
    """Reads ←/→ from a terminal stdin in a daemon thread (cbreak mode, restored on stop)."""

    def __init__(self, on_key: Any):
        self.on_key = on_key
        self._stop = False
        self._thread: Any = None
        self._saved: Any = None

    def start(self) -> None:
        try:
            import termios
            import threading
            import tty

            if not sys.stdin.isatty():
                return
            fd = sys.stdin.fileno()
            self._saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)
        except Exception:  # not a terminal we can drive: no key switching
            self._saved = None
            return
        self._thread = threading.Thread(target=self._run, name="eval-keys", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import os
        import select

        fd = sys.stdin.fileno()
        buf = b""
        while not self._stop:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                buf = (buf + os.read(fd, 16))[-8:]
            except OSError:
                return
            if buf.endswith(b"\x1b[D"):
                self.on_key(-1)
                buf = b""
            elif buf.endswith(b"\x1b[C"):
                self.on_key(+1)
                buf = b""

    def stop(self) -> None:
        self._stop = True
        if self._saved is not None:
            import termios

            try:
                termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self._saved)
            except Exception:
                pass
            self._saved = None


class RichDisplay:
    """Rich live view: overview of every eval, detail panel for one of them
    (the first running one; ←/→ select another when stdin is a terminal)."""

    def __init__(self, fullscreen: bool = False):
        from rich.console import Console

        self.console = Console(stderr=False)
        self.evals: list[EvalProgress] = []
        self.fullscreen = fullscreen
        self._live: Any = None
        self._tap: _LogTap | None = None
        self.selected: int | None = None
        self._keys = _ArrowKeys(self._select)

    def _select(self, step: int) -> None:
        if not self.evals:
            return
        current = self.selected if self.selected is not None else self.evals.index(self._active())  # type: ignore[arg-type]
        self.selected = (current + step) % len(self.evals)
        self.update(self.selected)

    def __enter__(self) -> "RichDisplay":
        from rich.live import Live

        self._live = Live(self._render(), console=self.console, refresh_per_second=4, screen=self.fullscreen, transient=False)
        self._live.__enter__()
        self._tap = _LogTap(self)
        self._tap.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        self._tap.addFilter(for_console)
        logging.getLogger("envs").addHandler(self._tap)
        self._keys.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._keys.stop()
        if self._tap is not None:
            logging.getLogger("envs").removeHandler(self._tap)
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.__exit__(*exc)

    def add(self, progress: EvalProgress) -> int:
        self.evals.append(progress)
        return len(self.evals) - 1

    def add_rows(self, idx: int, rows: list[dict[str, Any]]) -> None:
        pass

    def add_log(self, line: str) -> None:
        active = self._active()
        if active is not None:
            active.logs.append(line[:200])

    def _active(self) -> EvalProgress | None:
        if self.selected is not None and self.selected < len(self.evals):
            return self.evals[self.selected]
        for p in self.evals:
            if p.status == "running":
                return p
        return self.evals[-1] if self.evals else None

    def update(self, idx: int) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Any:
        from rich.console import Group
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        parts: list[Any] = []
        if len(self.evals) > 1:
            overview = Table.grid(padding=(0, 1))
            for _ in range(6):
                overview.add_column()
            active_p = self._active()
            for p in self.evals:
                overview.add_row(
                    Text(("▶ " if p is active_p else "  ") + p.label), ProgressBar(total=max(p.total, 1), completed=p.done, width=24),
                    f"{p.done}/{p.total}", f"reward {p.avg_reward:.3f}", f"errors {p.errors}", p.status,
                )
            parts.append(Panel(overview, title="evaluations (←/→ select)"))
        active = self._active()
        if active is not None:
            detail = Table.grid(padding=(0, 1))
            detail.add_column(style="bold")
            detail.add_column()
            detail.add_row("model", active.model)
            detail.add_row("progress", Group(ProgressBar(total=max(active.total, 1), completed=active.done, width=40)))
            detail.add_row("rollouts", f"{active.done}/{active.total}" + (f" ({active.resumed} resumed)" if active.resumed else ""))
            detail.add_row("avg reward", f"{active.avg_reward:.4f}")
            detail.add_row("errors", str(active.errors))
            detail.add_row("rate", f"{active.rate:.1f} rollouts/s")
            if active.output:
                detail.add_row("output", active.output)
            if active.logs:
                detail.add_row("log", Text("\n".join(active.logs)))
            parts.append(Panel(detail, title=Text(f"{active.label} [{active.status}]")))
        return Group(*parts)


def make_display(disable_tui: bool, fullscreen: bool = False) -> PlainDisplay | RichDisplay:
    if disable_tui:
        return PlainDisplay()
    return RichDisplay(fullscreen=fullscreen)


def _short(messages: Any, limit: int = 300) -> str:
    if isinstance(messages, list):
        text = "\n".join(f"{m.get('role')}: {m.get('content') or ''}".rstrip() for m in messages if isinstance(m, dict))
    else:
        text = str(messages or "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def print_summary(metadata: dict[str, Any], rows: list[dict[str, Any]], abbreviated: bool = False, plain: bool = False) -> None:
    """The end-of-run tables: settings, stats, and (unless abbreviated) sample rollouts."""
    from rich.console import Console

    console = Console(file=sys.stdout, force_terminal=False if plain else None, width=120 if plain else None)
    console.print(_settings_table(metadata))
    console.print(_stats_table(metadata, rows))
    if not abbreviated and rows:
        console.print(_samples_table(rows))


def _settings_table(metadata: dict[str, Any]) -> Any:
    """The run's settings: env args, examples x rollouts (and the -n asked for when the dataset
    is smaller), sampling args, status."""
    from rich.table import Table
    from rich.text import Text

    settings = Table(title=Text(f"{metadata.get('env_id')} — {metadata.get('model')}"), show_header=False)
    settings.add_column(style="bold")
    settings.add_column()
    settings.add_row("env_args", Text(str(metadata.get("env_args") or {})))
    settings.add_row("examples x rollouts", f"{metadata.get('num_examples')} x {metadata.get('rollouts_per_example')}"
                     + (f" (asked -n {metadata['num_examples_requested']}; the dataset has {metadata.get('num_examples')})"
                        if metadata.get("num_examples_requested") else ""))
    settings.add_row("sampling_args", Text(str(metadata.get("sampling_args") or {})))
    settings.add_row("status", str(metadata.get("status", "")))
    return settings


def _stats_table(metadata: dict[str, Any], rows: list[dict[str, Any]]) -> Any:
    """The results: rollouts scored / errored, average reward over the scored ones (and the
    metrics, pass@k), errors by verdict, retries, time and where the results are."""
    from rich.table import Table

    from envs.outputs import ERROR_VERDICTS, is_scored, verdict_counts, verdict_of

    stats = Table(title="results", show_header=True)
    stats.add_column("metric")
    stats.add_column("value", justify="right")
    scored = [r for r in rows if is_scored(r)]
    n = len(scored)
    counts = verdict_counts(rows)
    rewards = [float(r.get("reward") or 0.0) for r in scored]
    mean = sum(rewards) / n if n else 0.0
    std = (sum((x - mean) ** 2 for x in rewards) / n) ** 0.5 if n else 0.0
    stats.add_row("rollouts", f"{len(rows)}: {n} scored, {counts['errored']} errored")
    if counts["errored"]:
        kinds = ", ".join(f"{k}: {counts[k]}" for k in ERROR_VERDICTS if counts[k])
        stats.add_row("not scored", f"{counts['errored']} ({kinds}): out of the averages; rerun with --resume")
    stats.add_row("avg reward", f"{mean:.4f} ± {std:.4f}" + (f" (over {n} scored)" if len(rows) != n else ""))
    for key, value in sorted((metadata.get("avg_metrics") or {}).items()):
        stats.add_row(f"  {key}", f"{value:.4f}")
    for k, v in (metadata.get("pass_at_k") or {}).items():
        stats.add_row(f"pass@{k}", f"{v:.4f}")
    errs = collections.Counter("task (scored)" if is_scored(r) else verdict_of(r) for r in rows if r.get("error"))
    stats.add_row("errors", f"{sum(errs.values())}" + (f" ({', '.join(f'{k}: {c}' for k, c in errs.items())})" if errs else ""))
    retried = sum(1 for r in rows if int(r.get("attempts", 1)) > 1)
    if retried:
        stats.add_row("retried rollouts", str(retried))
    seconds = float(metadata.get("time_ms", 0)) / 1000
    stats.add_row("time", f"{seconds:.1f} s")
    if metadata.get("path_to_save"):
        stats.add_row("results", str(metadata["path_to_save"]))
    return stats


def _samples_table(rows: list[dict[str, Any]]) -> Any:
    """The first three rollouts: prompt, completion (or the error), reward."""
    from rich.table import Table
    from rich.text import Text

    samples = Table(title="samples", show_lines=True)
    samples.add_column("prompt", ratio=2)
    samples.add_column("completion", ratio=2)
    samples.add_column("reward", justify="right")
    for r in rows[:3]:
        comp = _short(r.get("completion"))
        if r.get("error"):
            comp = f"[error] {error_text(r['error'])}"
        samples.add_row(Text(_short(r.get("prompt"))), Text(comp), f"{float(r.get('reward') or 0):.3f}")
    return samples
