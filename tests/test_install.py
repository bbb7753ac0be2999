"""The sdist installs as a user installs it: into a fresh virtualenv, with pip, from PyPI's dependencies.

Without a usable C compiler (``CC=/bin/false``, as on a slim image or a locked-down runner)
the install succeeds on the pure-Python codec, its build prints one warning that names the
cause, and the installed package works and says why it is slow; with one, it gets the C codec
and says nothing. Each test runs outside the checkout, so only the installed package can be
imported, and runs the README's example against it.

They build and compile (here about 40 s without a compiler and 2 min with one, on a 2-core
machine), so they are marked ``slow`` (the serial part of ``dev.py test``, the C-codec pass
only) and ``install`` (``-m install`` runs them alone).
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fastnsq import _fallback

from . import doc_examples
from .helpers import build_environment as environment

pytestmark = [pytest.mark.slow, pytest.mark.install, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
README_EXAMPLE = next(e for e in doc_examples.examples(ROOT / "README.md") if e.kind == "python")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist of the checkout, as ``dev.py dist`` builds it (without PyPA's build, which .venv lacks)."""
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(out)], cwd=ROOT, check=True,
                   capture_output=True, env=environment())
    (path,) = out.glob("fastnsq_client-*.tar.gz")
    return path


def requirements(sdist: Path) -> list[str]:
    """The sdist's own dependencies (its PKG-INFO), without those of its extras."""
    with tarfile.open(sdist) as archive:
        member = next(m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        file = archive.extractfile(member)
        assert file is not None
        metadata = email.parser.Parser().parsestr(file.read().decode())
    return [req for req in metadata.get_all("Requires-Dist") or [] if "extra ==" not in req]


class Venv:
    """A fresh virtualenv in ``folder`` (outside the checkout), made from this Python."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        subprocess.run([sys.executable, "-m", "venv", str(folder / "venv")], check=True, env=environment())
        self.bin = folder / "venv" / "bin"

    def run(self, *command: str | Path, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(part) for part in command], cwd=self.folder, capture_output=True, text=True,
                              env=environment(**env), timeout=600, check=False)
        if check:
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    def install(self, sdist: Path, *, deps: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        """The dependencies (cached, as any install), then the sdist built by pip, verbose: its build's
        output is what the test reads. No cache for that build: pip would reuse an earlier one."""
        if deps:
            self.run(self.bin / "python", "-m", "pip", "install", "--quiet", *requirements(sdist))
        return self.run(self.bin / "python", "-m", "pip", "install", "-v", "--no-deps", "--no-cache-dir", sdist,
                        check=False, **env)

    def package(self) -> Path:
        """Where the installed fastnsq is (found without importing it)."""
        done = self.run(self.bin / "python", "-I", "-c",
                        "import importlib.util; print(importlib.util.find_spec('fastnsq').origin)")
        return Path(done.stdout.strip()).parent


def build_warnings(output: str) -> list[str]:
    return re.findall(r"WARNING: fastnsq: .*", output)


def runs_the_readme_example(venv: Venv) -> None:
    """Publish three messages to an embedded nsqd and consume them (the StopReport's count follows)."""
    done = venv.run(venv.bin / "python", "-c", README_EXAMPLE.code)
    assert done.stdout.startswith("[b'one', b'three', b'two'] ")


def test_without_a_compiler_the_sdist_installs_the_python_codec_and_says_why(sdist: Path, tmp_path: Path) -> None:
    venv = Venv(tmp_path)
    installed = venv.install(sdist, CC="/bin/false")
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    (warning,) = build_warnings(installed.stdout + installed.stderr)
    assert "the C compiler '/bin/false' failed on fastnsq._frame (exit status 1)" in warning
    assert f"decodes messages {_fallback.DECODE_SPEEDUP}x as fast" in warning
    assert "Set FASTNSQ_NO_EXTENSIONS=1" in warning and "FASTNSQ_REQUIRE_EXTENSIONS=1" in warning

    package = venv.package()
    assert package.is_relative_to(tmp_path / "venv")
    assert not list(package.glob("*.so"))
    version = venv.run(venv.bin / "fastnsq", "--version")
    assert version.stdout.splitlines()[1] == (
        "codec: Python (this install could not build them: the C compiler '/bin/false' failed on fastnsq._frame "
        "(exit status 1))")
    assert version.stderr.count("RuntimeWarning: fastnsq: the C extensions are not available") == 1
    runs_the_readme_example(venv)

    chosen = venv.run(venv.bin / "fastnsq", "--version", FASTNSQ_NO_EXTENSIONS="1")
    assert chosen.stdout.splitlines()[1] == "codec: Python (chosen by FASTNSQ_NO_EXTENSIONS=1)"
    assert "Warning" not in chosen.stderr
    required = venv.run(venv.bin / "python", "-c", "import fastnsq", check=False, FASTNSQ_REQUIRE_EXTENSIONS="1")
    assert required.returncode != 0 and "FASTNSQ_REQUIRE_EXTENSIONS=1 requires them" in required.stderr


def test_require_extensions_fails_the_install_without_a_compiler(sdist: Path, tmp_path: Path) -> None:
    venv = Venv(tmp_path)
    installed = venv.install(sdist, deps=False, CC="/bin/false", FASTNSQ_REQUIRE_EXTENSIONS="1")
    assert installed.returncode != 0
    assert "FASTNSQ_REQUIRE_EXTENSIONS=1 requires them" in installed.stdout + installed.stderr
    assert not venv.run(venv.bin / "python", "-m", "pip", "list").stdout.count("fastnsq")


def test_with_a_compiler_the_sdist_installs_the_c_codec(sdist: Path, tmp_path: Path) -> None:
    venv = Venv(tmp_path)
    installed = venv.install(sdist)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert build_warnings(installed.stdout + installed.stderr) == []

    package = venv.package()
    assert package.is_relative_to(tmp_path / "venv")
    assert sorted(p.name.split(".")[0] for p in package.glob("*.so")) == ["_blocking", "_coalesce", "_delivery", "_frame"]
    assert not (package / _fallback.NOTE_FILE).exists()
    assert not list(package.glob("*.pyx")) and not list(package.glob("*.c"))
    version = venv.run(venv.bin / "fastnsq", "--version")
    assert version.stdout.splitlines()[1] == "codec: C"
    assert "Warning" not in version.stderr
    runs_the_readme_example(venv)
