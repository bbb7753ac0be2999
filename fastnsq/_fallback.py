"""The pure-Python fallback explained: one message, the same when the build falls back and at import.

One job: say why fastnsq runs without its C extensions, what that costs and what to do about
it. ``setup.py`` loads this file by its path while building (the package is not installed
then), so it imports nothing: neither fastnsq nor anything outside the standard library.

The figures are the codec's micro-benchmarks, C against the pure-Python twin, medians on the
project's machine (``bench/results/codec.json``, ``python bench/codec_report.py``);
``tests/test_install.py`` checks them against that file.
"""

from __future__ import annotations

import os

#: The variable that chooses the pure-Python twins: no compile at install, no warning at import.
NO_EXTENSIONS = "FASTNSQ_NO_EXTENSIONS"
#: The variable that makes a build or an import without the C extensions an error.
REQUIRE_EXTENSIONS = "FASTNSQ_REQUIRE_EXTENSIONS"
#: Written into the package by a build that fell back: the cause, for the import's warning
#: (pip shows a build's output only with ``-v``) and ``fastnsq --version``.
NOTE_FILE = "_no_extensions.txt"

#: How many times as fast the C codec is: decoding messages (the consumer's path), and the
#: range over the operations measured (encoding FIN 7.1x ... an MPUB of 200 bodies 26.0x).
DECODE_SPEEDUP = 15
SPEEDUP_RANGE = (7, 26)


def flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to something other than off."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def explain(cause: str) -> str:
    """The one message: the cause, what the pure-Python codec costs, and the two switches."""
    low, high = SPEEDUP_RANGE
    return (
        f"fastnsq: the C extensions are not available ({cause}); fastnsq runs on its pure-Python "
        f"codec, which behaves the same but is slower: the C codec decodes messages {DECODE_SPEEDUP}x as "
        f"fast ({low}x-{high}x over the codec's operations, bench/results/codec.json). "
        f"Set {NO_EXTENSIONS}=1 to choose the pure-Python codec (no compile, no warning), "
        f"or {REQUIRE_EXTENSIONS}=1 to make this an error."
    )


def contradiction() -> str | None:
    """The error when both switches are set, else None."""
    if flag(NO_EXTENSIONS) and flag(REQUIRE_EXTENSIONS):
        return (f"{NO_EXTENSIONS}=1 chooses the pure-Python codec and {REQUIRE_EXTENSIONS}=1 requires the C "
                "extensions: set one of them")
    return None
