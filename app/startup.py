"""What the user sees while Python imports torch and transformers (seconds): a small window saying Glance is
starting. Imports only Qt, so it appears at once; the main window closes it when it shows."""

from __future__ import annotations

import sys

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLabel


def missing_system_libraries() -> str:
    """On Linux with X11, the one system library Qt's xcb plugin needs that minimal installs lack; "" otherwise."""
    import ctypes.util
    import os

    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM", "xcb") not in ("", "xcb"):
        return ""
    if os.environ.get("WAYLAND_DISPLAY") and not os.environ.get("DISPLAY"):
        return ""
    if ctypes.util.find_library("xcb-cursor") is None:
        return (
            "glance: Qt's X11 plugin needs libxcb-cursor0, which is not installed: run "
            "`sudo apt-get install libxcb-cursor0` (Debian/Ubuntu) or your system's equivalent"
        )
    return ""


def show_starting() -> QLabel:
    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("Glance")
    app.setOrganizationName("Glance")
    splash = QLabel("Glance is starting …\nloading the decoding engine (torch, transformers)")
    splash.setWindowFlags(Qt.WindowType.SplashScreen | Qt.WindowType.FramelessWindowHint)
    splash.setAlignment(Qt.AlignmentFlag.AlignCenter)
    splash.setStyleSheet("QLabel { background: #1c1f26; color: #e5e9f0; padding: 28px; font-size: 14px; }")
    splash.resize(420, 120)
    splash.show()
    for _ in range(3):  # let the window system map and paint it before the imports block the thread
        app.processEvents()
    return splash
