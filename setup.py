"""Build fastnsq's C extensions (the wire codec and its fast lanes), or fall back to their pure-Python twins.

FASTNSQ_NO_EXTENSIONS=1       skip the extensions: their pure-Python twins (_frame_py, ...) are used.
FASTNSQ_REQUIRE_EXTENSIONS=1  an extension that cannot be built fails the build (the default: the twins).
FASTNSQ_DEBUG=1               build with Cython bounds checks, C assertions and no optimisation.

When the extensions cannot be built (no C compiler, no Python headers, Cython's output failing
to compile) the install still succeeds: it prints one warning naming the cause, ships no
extension at all (the four are used together or not at all) and leaves the cause in the
package (fastnsq/_no_extensions.txt), where the import's warning and `fastnsq --version` read it.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError, SetupError

HERE = Path(__file__).resolve().parent


def _load_fallback():  # type: ignore[no-untyped-def]
    """fastnsq/_fallback.py by its path: the package and its dependencies are not installed yet."""
    spec = importlib.util.spec_from_file_location("_fastnsq_fallback", HERE / "fastnsq" / "_fallback.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fallback = _load_fallback()

#: What a machine that cannot compile raises: the compiler missing or failing (CompileError,
#: LinkError), a spawn that cannot start, no compiler for the platform (Windows without build
#: tools), an OS-level failure.
BUILD_FAILURES = (CCompilerError, ExecError, PlatformError, OSError)

EXTENSIONS = (
    ("fastnsq._frame", "fastnsq/_frame.pyx"),  # the wire codec
    ("fastnsq._coalesce", "fastnsq/_coalesce.pyx"),  # the producer's coalescing of publishes
    ("fastnsq._delivery", "fastnsq/_delivery.pyx"),  # the consumer's per-message path
    ("fastnsq._blocking", "fastnsq/_blocking.pyx"),  # the blocking producer's round trip
)


def _extensions() -> list[Extension]:
    if fallback.flag(fallback.NO_EXTENSIONS):
        return []
    debug = fallback.flag("FASTNSQ_DEBUG")
    macros = [("FASTNSQ_DEBUG", "1" if debug else "0")]
    compile_args = ["-O0", "-g3", "-UNDEBUG"] if debug else ["-O3"]
    return [Extension(name, [path], define_macros=macros, extra_compile_args=compile_args) for name, path in EXTENSIONS]


def _cythonize(extensions: list[Extension]) -> list[Extension]:
    from Cython.Build import cythonize

    debug = fallback.flag("FASTNSQ_DEBUG")
    directives = {
        "language_level": 3,
        "boundscheck": debug,
        "wraparound": debug,
        "initializedcheck": debug,
        "cdivision": not debug,
        "embedsignature": True,
    }
    return cythonize(extensions, compiler_directives=directives, force=debug)


class BuildExtOrFallBack(build_ext):
    """build_ext that, when the extensions cannot be compiled, leaves them out and says why."""

    def run(self) -> None:
        contradiction = fallback.contradiction()
        if contradiction:
            raise SetupError(contradiction)
        if not self.extensions:
            return
        self._failed_in = "cythonize"
        try:
            self._cythonize()
            super().run()
        except ImportError as exc:  # Cython itself (a --no-build-isolation build without it)
            self._fall_back(f"Cython is not installed ({exc}); the build needs Cython>=3.0")
        except BUILD_FAILURES as exc:
            self._fall_back(self._diagnose(exc))
        else:
            self._remove_note()

    def _cythonize(self) -> None:
        """The .pyx sources made C, on the extensions setuptools has already set up (only a build pays this)."""
        generated = {ext.name: ext.sources for ext in _cythonize(self.extensions)}
        for ext in self.extensions:
            ext.sources = generated[ext.name]

    def build_extension(self, ext: Extension) -> None:
        self._failed_in = ext.name
        super().build_extension(ext)

    def _diagnose(self, exc: BaseException) -> str:
        """The cause, most specific first: no compiler, no headers, else the compiler's failure."""
        command = getattr(self.compiler, "compiler_so", None) or ["the C compiler"]
        compiler = str(command[0])
        if getattr(self.compiler, "compiler_type", "") == "unix" and shutil.which(compiler) is None:
            return f"no C compiler: {compiler!r} is not on PATH"
        headers = sysconfig.get_paths()["include"]
        if not Path(headers, "Python.h").exists():
            return (f"the Python headers are missing: no Python.h in {headers} "
                    "(on Debian and Ubuntu: apt install python3-dev)")
        status = re.search(r"exit (?:status|code) -?\d+", str(exc))
        return f"the C compiler {compiler!r} failed on {self._failed_in} ({status.group(0) if status else exc})"

    def _fall_back(self, cause: str) -> None:
        if fallback.flag(fallback.REQUIRE_EXTENSIONS):
            raise SetupError(f"fastnsq: the C extensions could not be built ({cause}), and "
                             f"{fallback.REQUIRE_EXTENSIONS}=1 requires them")
        for ext in self.extensions:  # none half-built: the codec uses all four or none
            Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
        self.extensions = []
        note = self._note_path()
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(cause + "\n")
        print("WARNING: " + fallback.explain(cause), file=sys.stderr, flush=True)

    def _note_path(self) -> Path:
        package = Path(self.get_ext_fullpath("fastnsq._frame")).parent
        return package / fallback.NOTE_FILE

    def _remove_note(self) -> None:
        """A build that succeeded leaves no note of an earlier one that fell back (in place)."""
        self._note_path().unlink(missing_ok=True)


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExtOrFallBack})
