"""Every example on the documentation site's pages (docs/**/*.md) runs, as written.

The same runner as the README's examples (tests/doc_examples.py): Python blocks as
scripts, a block whose first line names a test file as a pytest module, shell blocks
that run the ``fastnsq`` command under bash; the Spark example skips, saying why, where
Java or pyspark is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import doc_examples

EXAMPLES = [example for page in doc_examples.doc_pages() for example in doc_examples.examples(page)]


def test_the_guides_have_examples():
    pages = {e.page.name for e in EXAMPLES}
    for page in ("getting-started.md", "consuming.md", "batches.md", "publishing.md", "tls-auth-compression.md",
                 "ha.md", "spark.md", "testing.md", "cli.md", "operating.md"):
        assert page in pages, f"docs/{page} has no example that runs"


@pytest.mark.parametrize("example", doc_examples.params(EXAMPLES))
def test_docs_example_runs(example: doc_examples.Example, tmp_path: Path) -> None:
    doc_examples.run(example, tmp_path)
