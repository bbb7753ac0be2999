"""``python -m fastnsq`` and the ``fastnsq`` console script: the command line (:mod:`fastnsq.cli`).

A command that runs a worker group (``worker``, ``to-file``, ``to-nsq``, ``to-http``) has its
first child process started here, before the command line's modules are imported: the child's
start-up then overlaps the supervisor's (:mod:`fastnsq.runner.spawning`), which halves the time
from the command to the first message handled. ``FASTNSQ_EARLY_CHILD=0`` turns that off.
"""

from __future__ import annotations

import os
import sys

#: The commands that run a supervisor and its children.
GROUP_COMMANDS = frozenset({"worker", "to-file", "to-nsq", "to-http"})
#: Flags that print and exit: no group runs.
PRINT_ONLY_FLAGS = frozenset({"-h", "--help", "-help", "--version"})


def runs_a_group(argv: list[str]) -> bool:
    return bool(argv) and argv[0] in GROUP_COMMANDS and not PRINT_ONLY_FLAGS.intersection(argv)


def main() -> int:
    if runs_a_group(sys.argv[1:]) and os.environ.get("FASTNSQ_EARLY_CHILD", "1") != "0":
        from .runner.spawning import start_first_child

        start_first_child()
    from .cli.main import main as run_command_line

    return run_command_line()


if __name__ == "__main__":
    sys.exit(main())
