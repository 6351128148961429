"""Glance's Qt front end: a thin layer that renders the engine's event stream."""

import os

# Before any QApplication exists: Qt's raster engine otherwise hands large fills (chart bars, widget backgrounds) to a
# thread pool and waits, and those threads preempt the engine's OpenMP threads mid-forward (py-spy showed the GUI
# thread in QPicture::play -> drawPolygon -> QLatch::wait during races). Serial fills cost the window less.
os.environ.setdefault("QT_NO_GUI_THREADPOOL", "1")
