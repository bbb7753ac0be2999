"""Sphinx configuration of fastnsq's documentation site.

Build it strictly (any warning fails) with ``python3 dev.py docs``, or by hand:
``.venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html``.
The pages are Markdown (MyST), readable as they are on GitHub; the API reference is
autodoc over fastnsq's docstrings. tests/test_docs.py builds it the same way and
checks it in headless Chromium; tests/test_docs_examples.py runs every example.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's fastnsq (with its built extensions), as the tests use it

import fastnsq

project = "fastnsq"
author = "the fastnsq developers"
copyright = "the fastnsq developers"
release = fastnsq.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Markdown: GitHub-style anchors for headings (links like ``consuming.md#batches``), tables.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# The API reference: members in source order, signatures with their annotations.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
# Annotations that autodoc would try to evaluate lazily; keep them as written.
autodoc_preserve_defaults = True

html_theme = "furo"
html_title = f"fastnsq {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
pygments_style = "friendly"
pygments_dark_style = "monokai"


class CommandHelp(SphinxDirective):
    """``{command-help} fastnsq pub``: what ``fastnsq pub --help`` prints, run at build time.

    The command line's reference is its own ``--help``, so this page cannot drift from it.
    """

    required_arguments = 1
    final_argument_whitespace = True

    def run(self) -> list[nodes.Node]:
        words = self.arguments[0].split()
        if words[0] == "fastnsq":
            command = [sys.executable, "-m", "fastnsq", *words[1:], "--help"]
        elif words[:2] == ["python", "-m"]:
            command = [sys.executable, "-m", *words[2:], "--help"]
        else:
            raise self.error(f"command-help: not a fastnsq command: {self.arguments[0]!r}")
        env = dict(os.environ, COLUMNS="96", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False)
        if result.returncode != 0:
            raise self.error(f"command-help: {' '.join(words)} --help exited {result.returncode}: {result.stderr}")
        text = result.stdout.rstrip()
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def setup(app: Sphinx) -> dict[str, bool]:
    app.add_directive("command-help", CommandHelp)
    return {"parallel_read_safe": True}
