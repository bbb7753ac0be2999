"""Build fastnsq's C extensions (the wire codec and its fast lanes) unless told not to.

FASTNSQ_NO_EXTENSIONS=1  skip the extensions: their pure-Python twins (_frame_py, ...) are used.
FASTNSQ_DEBUG=1          build with Cython bounds checks, C assertions and no optimisation.
"""

import os

from setuptools import Extension, setup


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "no")


def _extensions() -> list:
    if _flag("FASTNSQ_NO_EXTENSIONS"):
        return []
    from Cython.Build import cythonize

    debug = _flag("FASTNSQ_DEBUG")
    directives = {
        "language_level": 3,
        "boundscheck": debug,
        "wraparound": debug,
        "initializedcheck": debug,
        "cdivision": not debug,
        "embedsignature": True,
    }
    macros = [("FASTNSQ_DEBUG", "1" if debug else "0")]
    compile_args = ["-O0", "-g3", "-UNDEBUG"] if debug else ["-O3"]
    extensions = [
        Extension(name, [path], define_macros=macros, extra_compile_args=compile_args)
        for name, path in (
            ("fastnsq._frame", "fastnsq/_frame.pyx"),  # the wire codec
            ("fastnsq._coalesce", "fastnsq/_coalesce.pyx"),  # the producer's coalescing of publishes
            ("fastnsq._delivery", "fastnsq/_delivery.pyx"),  # the consumer's per-message path
            ("fastnsq._blocking", "fastnsq/_blocking.pyx"),  # the blocking producer's round trip
        )
    ]
    return cythonize(extensions, compiler_directives=directives, force=debug)


setup(ext_modules=_extensions())
