"""Every example in README.md runs, as written (a fresh interpreter or shell each).

The README keeps one example; the documentation site's pages hold the others
(tests/test_docs_examples.py runs those). How an example is run: tests/doc_examples.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import doc_examples

README = doc_examples.ROOT / "README.md"
EXAMPLES = doc_examples.examples(README)


def test_the_readme_has_an_example():
    assert [e for e in EXAMPLES if e.kind == "python"]


@pytest.mark.parametrize("example", doc_examples.params(EXAMPLES))
def test_readme_example_runs(example: doc_examples.Example, tmp_path: Path) -> None:
    doc_examples.run(example, tmp_path)
