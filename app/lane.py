"""One lane per variant: live text with every token colored by who produced it, and a header of live stats."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import partial

from PySide6.QtCore import QEvent, Signal
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QFrame, QLabel, QTextEdit, QToolTip, QVBoxLayout

from app.decomposition import DecompositionView
from app.theme import ALARM, REJECTED, VERDICT, depth_shade, variant_color
from engine import RunStats, RunSummary, StepEvent, StepText, compare, decompose, node_depths


@dataclass
class LaneStats(RunStats):
    """The engine's running statistics of one lane; the run summary's numbers win once it arrives."""

    summary: RunSummary | None = None

    @property
    def tau(self) -> float:
        return self.summary.mean_accepted_length if self.summary else super().tau

    @property
    def acceptance(self) -> float | None:
        return self.summary.acceptance_rate if self.summary else super().acceptance

    @property
    def tokens_per_second(self) -> float:
        return self.summary.tokens_per_second if self.summary else super().tokens_per_second


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token over the common length, or None when one is a prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _set_text(label: QLabel, text: str, style: str | None = None) -> None:
    """Touch the label only when its text or style really changes (a style sheet re-polishes the widget)."""
    if label.text() != text:
        label.setText(text)
    if style is not None and label.property("glanceStyle") != style:
        label.setProperty("glanceStyle", style)
        label.setStyleSheet(style)


class TokenView(QTextEdit):
    """Read-only text that knows which step produced each character, for click-to-inspect."""

    stepClicked = Signal(int)

    def __init__(self) -> None:
        super().__init__()
        self.setReadOnly(True)
        self.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        font = QFont("monospace")
        font.setStyleHint(QFont.StyleHint.Monospace)
        self.setFont(font)
        self.starts: list[int] = []
        self.steps: list[int] = []
        self.tips: list[object] = []  # per token: its tooltip, or a callable that builds it when hovered

    def mark(self, start: int, step: int, tip: object = "") -> None:
        self.starts.append(start)
        self.steps.append(step)
        self.tips.append(tip)

    def step_at(self, position: int) -> int | None:
        i = bisect.bisect_right(self.starts, position) - 1
        return self.steps[i] if i >= 0 else None

    def tip_at(self, position: int) -> str:
        i = bisect.bisect_right(self.starts, position) - 1
        if i < 0:
            return ""
        tip = self.tips[i]
        return tip() if callable(tip) else tip

    def viewportEvent(self, event) -> bool:  # noqa: N802 (Qt naming)
        if event.type() == QEvent.Type.ToolTip:
            tip = self.tip_at(self.cursorForPosition(event.pos()).position())
            if tip:
                QToolTip.showText(event.globalPos(), tip, self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        super().mouseReleaseEvent(event)
        step = self.step_at(self.cursorForPosition(event.position().toPoint()).position())
        if step is not None:
            self.stepClicked.emit(step)

    def reset(self) -> None:
        self.clear()
        self.starts.clear()
        self.steps.clear()
        self.tips.clear()


STOP_WORDS = {"max_new_tokens": "reached max tokens", "eos": "end of text", "cancelled": "stopped"}
HEADER_HELP = (
    "tok/s: new tokens per second on this lane's own clock · τ (tau): tokens emitted per verification step, the "
    "target's own token included (plain decoding: 1.00) · acc: accepted draft tokens / drafted · Nx: speed over "
    "plain decoding in this race, 'a tie' when within two standard errors of the two lanes' step times, 'no drafts' "
    "when the lane never drafted (its speed then says nothing of drafting) · drafted: the share of its steps that "
    "verified a draft"
)


def _draft_tip(step: int, depth: int, prob: float) -> str:
    return f"step {step} · draft depth {depth} · target p = {prob:.3f}"


def _target_tip(step: int, prob: float) -> str:
    return f"step {step} · target's own token · p = {prob:.3f}"


def visible_whitespace(text: str) -> str:
    """Spaces and line breaks as visible marks, for struck-through rejected tokens."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")


class LaneWidget(QFrame):
    """Title, stats header and token view of one variant."""

    stepClicked = Signal(str, int)  # lane name, step
    guideRequested = Signal(str)  # lane name: its method's card was asked for

    def __init__(self, name: str, label: str | None = None) -> None:
        super().__init__()
        self.setObjectName("lane")
        self.name = name
        self.color = variant_color(name)
        self.stats = LaneStats()
        self.events: list[StepEvent] = []
        self.texts: dict[int, StepText] = {}  # step -> the text decoded for it (the app's, beside the event)
        self.show_rejected = False
        self.plain_step: float | None = None  # seconds of a one-token forward: plain's step where no plain lane runs
        self.pending: list[StepEvent] = []
        self.dirty = False  # something arrived since the last render: the next frame redraws this lane
        self.title = QLabel(f"{label or name} <a href='guide' style='color: gray'>(guide)</a>")
        self.title.setWordWrap(True)
        self.title.setToolTip("open the guide card of this method")
        self.title.linkActivated.connect(lambda _: self.guideRequested.emit(self.name))
        self.title.setObjectName("laneTitle")
        self.set_theme("dark")
        self.header = QLabel("waiting")
        self.header.setObjectName("laneStats")
        self.header.setWordWrap(True)
        self.header.setToolTip(HEADER_HELP)
        self.header.setMinimumHeight(2 * self.header.fontMetrics().lineSpacing())  # token areas start level
        self.match = QLabel("")
        self.match.setWordWrap(True)
        self.decomposition = DecompositionView(self.color)
        self.view = TokenView()
        self.view.setMinimumHeight(3 * self.view.fontMetrics().lineSpacing())  # rows of lanes fit a small screen
        self.view.stepClicked.connect(lambda step: self.stepClicked.emit(self.name, step))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        for w in (self.title, self.header, self.decomposition, self.match):
            lay.addWidget(w)
        lay.addWidget(self.view, 1)
        self._formats: dict[tuple, QTextCharFormat] = {}

    def _format(self, kind: str, depth: int) -> QTextCharFormat:
        """One cached format per (kind, depth): tooltips come from the view on hover, so inserting a token costs
        one Qt call (measured: per-token formats were part of what the window cost the engine)."""
        fmt = self._formats.get((kind, depth))
        if fmt is None:
            fmt = QTextCharFormat()
            if kind == "draft":
                fmt.setBackground(depth_shade(self.color, depth))
            elif kind == "rejected":
                fmt.setForeground(QColor(REJECTED))
                fmt.setFontStrikeOut(True)
            fmt.setProperty(QTextCharFormat.Property.UserProperty, kind)
            self._formats[(kind, depth)] = fmt
        return fmt

    def add_event(self, ev: StepEvent, text: StepText | None = None) -> None:
        """Queue a step and its decoded text for the next frame; stats update at once."""
        self.events.append(ev)
        if text is not None:
            self.texts[ev.step] = text
        self.stats.add(ev)
        self.pending.append(ev)
        self.dirty = True

    def set_summary(self, summary: RunSummary) -> None:
        self.stats.summary = summary
        self.dirty = True

    def render(self, baseline: LaneWidget | None, reason: str, baseline_changed: bool, headers: bool = True) -> None:
        """Draw what arrived since the last frame (the header only when `headers`: it may wait for a later frame);
        a finished, unchanged lane costs no Qt call at all."""
        if self.pending:
            self.flush()
        if headers and (self.dirty or baseline_changed):
            self.update_header(baseline)
            self.update_match(baseline, reason)
            self.dirty = False

    def flush(self) -> None:
        """Render queued steps at the end of the text, one insert per run of tokens that share a format: every Qt call
        from Python hands the interpreter lock back and forth with the engine thread (measured: per-token inserts
        were most of what a frame cost). Positions count UTF-16 units, as the document does."""
        if not self.pending:
            return
        cursor = QTextCursor(self.view.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        position = cursor.position()
        runs: list[tuple[str, QTextCharFormat]] = []
        for ev in self.pending:
            for text, fmt, tip in self._pieces(ev):
                self.view.mark(position, ev.step, tip)
                position += len(text.encode("utf-16-le")) // 2
                if runs and runs[-1][1] is fmt:
                    runs[-1] = (runs[-1][0] + text, fmt)
                else:
                    runs.append((text, fmt))
        cursor.beginEditBlock()
        for text, fmt in runs:
            cursor.insertText(text, fmt)
        cursor.endEditBlock()
        self.pending.clear()
        self.view.ensureCursorVisible()

    def _pieces(self, ev: StepEvent):
        """(text, format, tooltip) of each token the step shows, rejected draft tokens before the target's
        correction when they are shown; tooltips are built only when hovered."""
        text = self.texts.get(ev.step)
        pieces = text.pieces if text is not None else [f"<{t}>" for t in ev.tokens]
        depth_of = node_depths(ev.draft_parents)
        n_acc = len(ev.accepted_nodes)
        for k, (piece, prob) in enumerate(zip(pieces, ev.target_probs)):
            if k == n_acc and self.show_rejected:
                for rp in text.rejected if text is not None else []:
                    tip = f"step {ev.step}: rejected draft token"
                    yield visible_whitespace(rp), self._format("rejected", 0), tip  # not dashes
            if ev.from_draft[k]:
                d = depth_of[ev.accepted_nodes[k]]
                yield piece, self._format("draft", d), partial(_draft_tip, ev.step, d, prob)
            else:
                yield piece, self._format("target", 0), partial(_target_tip, ev.step, prob)

    def update_header(self, baseline: LaneWidget | None) -> None:
        s = self.stats
        acc = "–" if s.acceptance is None else f"{s.acceptance:.0%}"
        tau = f"{s.tau:.2f}" if s.steps or s.summary else "–"  # before the first step (a replay's start): no tau yet
        parts = [f"{s.tokens_per_second:6.1f} tok/s", f"τ {tau}", f"acc {acc}", f"{s.new_tokens} tok"]
        versus = compare(s, baseline.stats) if baseline is not None and baseline is not self else None
        if versus is not None:
            taken_apart = decompose(s, baseline.stats) if versus.drafted else None
        else:  # no plain lane in this race: the load's timed forward stands for its step
            taken_apart = decompose(s, None, self.plain_step) if baseline is None and s.drafted_steps else None
        self.decomposition.show_parts(taken_apart)
        if versus is not None:
            parts.append(versus.verdict)
            if versus.drafted:
                parts.append(f"drafted {versus.drafted:.0%} of steps")
        if s.pool_size is not None:
            hit = "–" if s.hit_rate is None else f"{s.hit_rate:.0%}"
            parts.append(f"pool {s.pool_size} · hit {hit}")
        if s.summary is not None:
            parts.append(STOP_WORDS.get(s.summary.stop_reason, s.summary.stop_reason))
            if s.summary.approximate:
                parts.append("APPROXIMATE")
            if s.summary.settings.get("state_rollback"):  # a hybrid target: trees verified as chains
                parts.append("recurrent target: chains, rejections replayed")
        # Items never break inside ("τ" on one line, "1.00" on the next): spaces within an item do not wrap.
        _set_text(self.header, " · ".join(p.strip().replace(" ", "\u00a0") for p in parts))

    def update_match(self, baseline: LaneWidget | None, reason: str) -> None:
        if baseline is None or baseline is self:
            _set_text(self.match, "baseline" if baseline is self else "")
            return
        diff = first_difference(self.stats.tokens, baseline.stats.tokens)
        if reason.startswith("sampled"):  # different draws are expected: the check is the distribution, in tests
            _set_text(self.match, f"≈ {reason}", f"color: {VERDICT}")
        elif diff is None:
            _set_text(self.match, "✓ matches the baseline token for token", f"color: {VERDICT}")
        elif reason:  # explained (reduced precision): neutral, with the fix
            _set_text(self.match, f"differs from the baseline at token {diff}: {reason}", f"color: {VERDICT}")
        else:
            _set_text(
                self.match, f"✗ differs at token {diff} in float32 greedy: a bug, please report it", f"color: {ALARM}"
            )

    def set_theme(self, theme: str) -> None:
        """The title in the lane's colour, darker on a light background (yellow and orange stay readable)."""
        color = self.color.darker(170) if theme == "light" else self.color
        self.title.setStyleSheet(f"color: {color.name()}")

    def set_show_rejected(self, on: bool) -> None:
        """Re-render everything with or without rejected draft tokens."""
        self.show_rejected = on
        self.view.reset()
        self.pending = list(self.events)
        self.flush()

    def reset(self) -> None:
        self.stats = LaneStats()
        self.events.clear()
        self.texts.clear()
        self.pending.clear()
        self.dirty = False
        self.view.reset()
        _set_text(self.header, "waiting")
        _set_text(self.match, "")
        self.decomposition.show_parts(None)

    def text(self) -> str:
        return self.view.toPlainText()

    def event_for_step(self, step: int) -> StepEvent | None:
        return next((e for e in self.events if e.step == step), None)
