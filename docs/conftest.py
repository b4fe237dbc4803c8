"""The doctests in docs/*.md import helpers from docs/make_figures.py."""

import os
import sys

_DOCS_DIR = os.path.dirname(os.path.abspath(__file__))
if _DOCS_DIR not in sys.path:
    sys.path.insert(0, _DOCS_DIR)
