"""The documentation site builds without a warning, and its pages render in a browser.

The site is built once per session as ``python3 dev.py docs`` builds it (Sphinx, ``-W``:
any warning is an error: a broken link, an API object autodoc cannot import, a docstring
that is not valid reST). Then headless Chromium (Debian's ``chromium``, which .ci/run
installs when missing) loads the index and the API pages from a local HTTP server and
the rendered DOM must hold their content: the navigation, the Consumer's documented
methods, the Message's attributes. Where no Chromium can be found the render check
skips and says why.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import doc_examples

pytestmark = pytest.mark.docs

ROOT = doc_examples.ROOT
DOCS = doc_examples.DOCS
BROWSERS = ("chromium", "chromium-browser", "google-chrome")

Site = tuple[Path, "subprocess.CompletedProcess[str]"]
Browser = tuple[list[str], dict[str, str]]


def sphinx_command(out: Path, doctrees: Path) -> list[str]:
    """The strict build (the same as ``python3 dev.py docs``)."""
    return [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
            "-d", str(doctrees), str(DOCS), str(out)]


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    try:
        import furo  # noqa: F401
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError as exc:  # a failure, not a skip: CI must build the site
        pytest.fail(f"the docs extra is not installed ({exc}): pip install -e '.[docs]' (dev.py installs it)")
    base = tmp_path_factory.mktemp("docs")
    out = base / "html"
    result = subprocess.run(sphinx_command(out, base / "doctrees"), cwd=ROOT, capture_output=True, text=True,
                            timeout=600, check=False)
    return out, result


def test_the_site_builds_without_a_warning(site: Site) -> None:
    out, result = site
    assert result.returncode == 0, f"sphinx -W failed:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stderr and "ERROR" not in result.stderr, result.stderr
    assert (out / "index.html").exists()


def test_every_page_is_built_and_reachable_from_the_index(site: Site) -> None:
    out, _ = site
    index = (out / "index.html").read_text()
    for page in doc_examples.doc_pages():
        html = out / page.relative_to(DOCS).with_suffix(".html")
        assert html.exists(), f"{page} was not built"
        if page.name != "index.md":  # every page is in the navigation of the index
            assert f'href="{html.relative_to(out).as_posix()}"' in index, f"{page} is not in the index's navigation"


def test_the_readme_links_to_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "](docs/index.md)" in readme
    assert "python3 dev.py docs" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"


def test_no_raw_directive_leaks_into_a_page(site: Site) -> None:
    """A directive MyST did not run shows up as text (e.g. '.. py:class::' or '{autoclass}')."""
    out, _ = site
    for html in out.rglob("*.html"):
        if "_modules" in html.parts:  # viewcode's source listings
            continue
        text = html.read_text()
        for leak in (".. py:", ".. auto", "{eval-rst}", "{autoclass}", "{include}", "{command-help}"):
            assert leak not in text, f"{html.relative_to(out)} shows {leak!r}"


# ---- the render check in headless Chromium ---------------------------------------------------


def find_browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def served(site: Site) -> Iterator[str]:
    """The built site on http://127.0.0.1:<free port>/, for the browser."""
    out, result = site
    if result.returncode != 0:
        pytest.fail("the site did not build (see test_the_site_builds_without_a_warning)")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """Headless Chromium with a throw-away profile (and HOME, where it keeps other state)."""
    path = find_browser()
    if path is None:
        pytest.skip("render check skipped: no headless Chromium on PATH (Debian: apt-get install chromium; "
                    ".ci/run installs it when it can)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    command = [path, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}"]
    yield command, dict(os.environ, HOME=str(profile))


def render(browser: Browser, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command, env = browser
    result = subprocess.run([*command, *extra, url], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert result.returncode == 0, f"chromium failed on {url}:\n{result.stderr[-3000:]}"
    return result


def dom(browser: Browser, url: str) -> str:
    return render(browser, url, "--dump-dom").stdout


def test_the_index_renders(browser: Browser, served: str) -> None:
    page = dom(browser, f"{served}/index.html")
    assert "<title>fastnsq" in page
    assert "An <a" in page and "NSQ</a> client for Python" in page  # the first paragraph
    # Furo's navigation: every guide and the API reference.
    assert 'class="sidebar-tree"' in page
    for title in ("Getting started", "Consuming", "Publishing", "The HA dialect", "Spark", "Operating",
                  "Benchmarks", "Migrating from go-nsq and pynsq", "API reference"):
        assert f">{title}" in page, f"the index's navigation lacks {title!r}"


def test_the_api_pages_render(browser: Browser, served: str) -> None:
    consumer = dom(browser, f"{served}/api/consumer.html")
    assert 'id="fastnsq.Consumer"' in consumer
    for method in ("start", "stop", "batches", "is_starved", "set_max_in_flight", "stats"):
        assert f'id="fastnsq.Consumer.{method}"' in consumer, f"Consumer.{method} is not documented"
    assert "Drain and close: CLS everywhere" in consumer  # a docstring, rendered
    assert 'id="fastnsq.StopReport"' in consumer and 'id="fastnsq.Batch.finish"' in consumer

    producer = dom(browser, f"{served}/api/producer.html")
    for method in ("publish", "mpublish", "close"):
        assert f'id="fastnsq.Producer.{method}"' in producer

    message = dom(browser, f"{served}/api/message.html")
    assert 'id="fastnsq.Message.finish"' in message and "the key to deduplicate on" in message

    index = dom(browser, f"{served}/api/index.html")
    assert 'href="consumer.html"' in index and 'href="testing.html"' in index


def test_a_missing_page_is_a_404_and_the_pages_are_not(served: str) -> None:
    import urllib.error
    import urllib.request

    for page in ("index.html", "api/consumer.html", "getting-started.html", "_static/scripts/furo.js"):
        with urllib.request.urlopen(f"{served}/{page}", timeout=10) as answer:
            assert answer.status == 200, page
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{served}/no-such-page.html", timeout=10)
    assert missing.value.code == 404


def test_screenshots_of_the_index_and_the_consumer_api(browser: Browser, served: str, tmp_path: Path) -> None:
    """Pixels, not just a DOM: a page that renders blank makes a tiny, uniform PNG."""
    for name, url in (("index", f"{served}/index.html"), ("consumer", f"{served}/api/consumer.html")):
        shot = tmp_path / f"{name}.png"
        render(browser, url, "--window-size=1280,1600", f"--screenshot={shot}")
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{name}: not a PNG"
        assert len(data) > 40_000, f"{name}: the screenshot is nearly empty ({len(data)} bytes)"
        if os.environ.get("FASTNSQ_DOCS_SCREENSHOTS"):  # keep them to look at
            target = Path(os.environ["FASTNSQ_DOCS_SCREENSHOTS"])
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, target / shot.name)
