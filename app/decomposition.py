"""Under each lane's header: its speedup taken apart, speedup = tau / (draft + verify + other), each part in plain
decoding's steps. A bar stacks the parts a step costs; the tick marks tau, the tokens a step buys: a lane wins where
its bar ends before its tick."""

from __future__ import annotations

from PySide6.QtCore import QRectF
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from engine import Decomposition

PARTS = (("draft", 1.0), ("verify", 0.55), ("other", 0.25))  # each part's share of the lane colour's strength


class CostBar(QWidget):
    """The three parts stacked, and a tick at tau, on one scale."""

    def __init__(self, color: QColor) -> None:
        super().__init__()
        self.color = color
        self.parts: Decomposition | None = None
        self.setFixedHeight(10)

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        d = self.parts
        if d is None:
            return
        painter = QPainter(self)
        values = [d.draft, d.verify, d.other]
        scale = (self.width() - 2) / max(d.tau, sum(values), 1e-9)
        x = 1.0
        for (_, strength), value in zip(PARTS, values):
            shade = QColor(self.color)
            shade.setAlphaF(strength)
            painter.fillRect(QRectF(x, 1, value * scale, self.height() - 2), shade)
            x += value * scale
        painter.setPen(QPen(self.palette().text().color(), 2))
        tick = 1 + d.tau * scale
        painter.drawLine(int(tick), 0, int(tick), self.height())
        painter.end()


class DecompositionView(QWidget):
    """The bar and its numbers; hover gives the formula and each part in milliseconds."""

    def __init__(self, color: QColor) -> None:
        super().__init__()
        self.bar = CostBar(color)
        self.text = QLabel("")
        self.text.setWordWrap(True)
        self.text.setObjectName("laneDecomposition")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(1)
        lay.addWidget(self.bar)
        lay.addWidget(self.text)
        self.setVisible(False)

    def show_parts(self, d: Decomposition | None) -> None:
        self.setVisible(d is not None)
        if d is None:
            return
        self.bar.parts = d
        self.bar.update()
        text = (
            f"τ\u00a0{d.tau:.2f} ÷ (draft\u00a0{d.draft:.2f} + verify\u00a0{d.verify:.2f} + other\u00a0{d.other:.2f})"
            f" = {d.speedup:.2f}x"
        )
        if self.text.text() != text:
            self.text.setText(text)
            ms = d.plain_ms
            self.setToolTip(
                "speedup = τ / (draft + verify + other), each part in plain decoding steps of this target "
                f"({ms:.2f} ms each in this race) per step of this lane:\n"
                f"draft {d.draft * ms:.2f} ms · verify {d.verify * ms:.2f} ms · other (the prompt's prefill, "
                f"spread over the steps) {d.other * ms:.2f} ms.\nThe bar stacks them; the tick marks τ, the tokens a "
                "step buys: the lane wins where the bar ends before the tick."
            )
