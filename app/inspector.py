"""Step inspector: the draft of one step as a tree, the accepted path highlighted, the target's top tokens per node."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import QLabel, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from app.theme import REJECTED
from engine import StepEvent, is_chain, node_depths

EMPTY = "Click a token or a point on the accepted-length chart to inspect its step."


def budget_text(ev: StepEvent) -> str:
    """What the cost-aware draft budget allowed this step, when one ran."""
    if ev.step == 0 or ev.budget is None:
        return ""
    cap = ev.budget.depth_cap
    if cap is None and ev.notes.window is not None:
        return " (budget: the window, rated above a plain step)"
    if cap is None:
        return " (budget: uncapped)"
    if cap == 0:
        return " (budget: a plain step)"
    if ev.budget.narrow:
        return f" (budget: the tree's greedy spine, at most {cap} deep)"
    return f" (budget: at most {cap} deep)"


class StepInspector(QWidget):
    def __init__(self) -> None:
        super().__init__()
        self.title = QLabel(EMPTY)
        self.title.setWordWrap(True)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["node", "token", "depth", "verdict", "target's top tokens (p)"])
        self.tree.setColumnWidth(0, 150)
        self.tree.header().setStretchLastSection(True)
        self.tree.setColumnWidth(1, 200)
        lay = QVBoxLayout(self)
        lay.addWidget(self.title)
        lay.addWidget(self.tree)
        self.shown: tuple[str, int] | None = None

    def clear(self) -> None:
        """Forget the shown step (a new race started)."""
        self.shown = None
        self.tree.clear()
        self.title.setText(EMPTY)

    def show_step(self, lane: str, ev: StepEvent, decode: Callable[[int], str]) -> None:
        self.shown = (lane, ev.step)
        self.tree.clear()
        kind = "prefill" if ev.step == 0 else ("chain" if is_chain(ev.draft_parents) else "tree")
        self.title.setText(
            f"{lane} · step {ev.step} · {kind} of {len(ev.draft_tokens)} draft tokens{budget_text(ev)} · "
            f"accepted {len(ev.accepted_nodes)} · emitted {len(ev.tokens)} · "
            f"draft {ev.draft_seconds * 1e3:.1f} ms · verify {ev.verify_seconds * 1e3:.1f} ms"
        )

        def top_text(row: int) -> str:
            if row >= len(ev.target_top):
                return ""
            return "  ".join(f"{decode(t)!r} {p:.2f}" for t, p in ev.target_top[row])

        root = QTreeWidgetItem(["pending", "", "0", "", top_text(0)])
        self.tree.addTopLevelItem(root)
        items = {-1: root}
        accepted = set(ev.accepted_nodes)
        bold = QFont()
        bold.setBold(True)
        depth = dict(enumerate(node_depths(ev.draft_parents)))
        draft_ids = ev.notes.draft_ids  # EAGLE-3: each node's id in the head's reduced vocabulary
        for i, (tok, parent) in enumerate(zip(ev.draft_tokens, ev.draft_parents)):
            verdict = "✓ accepted" if i in accepted else "✗ rejected"
            shown = repr(decode(tok)) + (f"  (draft {draft_ids[i]} → {tok})" if draft_ids else "")
            item = QTreeWidgetItem([f"node {i}", shown, str(depth[i]), verdict, top_text(i + 1)])
            if i in accepted:  # the colour grammar: verdicts are symbols and weight, lane colours stay with lanes
                for c in range(5):
                    item.setFont(c, bold)
            else:
                for c in range(4):
                    item.setForeground(c, QBrush(QColor(REJECTED)))
            items[parent].addChild(item)
            items[i] = item
        bonus = ev.tokens[-1]
        last = ev.accepted_nodes[-1] if ev.accepted_nodes else -1
        verdict = "target's own token"
        if ev.notes.target_in_draft_vocab is False:
            verdict += f" (outside the {ev.notes.draft_vocab or ''}-token draft vocabulary)"
        items[last].addChild(QTreeWidgetItem(["target", repr(decode(bonus)), str(depth.get(last, 0) + 1), verdict, ""]))
        if ev.notes.block_size:  # DFlash: one forward filled the block; its first drafts were verified
            kept = len(ev.accepted_nodes)
            self.tree.addTopLevelItem(QTreeWidgetItem([
                "block", f"{ev.notes.block_size} positions", "", f"{len(ev.draft_tokens)} drafts verified, {kept} kept",
                "one draft forward: the pending token, then a mask at every other position",
            ]))  # fmt: skip
        if ev.notes.window is not None:  # lookahead: the Jacobi window fed to this step and the n-grams it verified
            window = QTreeWidgetItem(["window", f"{len(ev.notes.window)} levels", "", "lookahead branch", ""])
            for lvl, level in enumerate(ev.notes.window):
                window.addChild(
                    QTreeWidgetItem([f"level {lvl}", "", "", "", "  ".join(repr(decode(t)) for t in level)])
                )
            grams = QTreeWidgetItem(["n-grams", str(len(ev.notes.ngrams or [])), "", "verified", ""])
            for gram in ev.notes.ngrams or []:
                grams.addChild(QTreeWidgetItem(["", "", "", "", " ".join(repr(decode(t)) for t in gram)]))
            self.tree.addTopLevelItem(window)
            self.tree.addTopLevelItem(grams)
        self.tree.expandAll()
        self.tree.resizeColumnToContents(0)  # deep nodes are indented: their names are not cut to "nod..."
