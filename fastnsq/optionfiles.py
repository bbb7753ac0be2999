"""The files written from the option table: the TypedDicts and the docs' option reference.

One job: render :data:`fastnsq.optionspec.OPTIONS` as ``fastnsq/typed_options.py`` (static
source, so that mypy and pyright read every option's type, and editors its doc) and as
``docs/options.md``. ``python -m fastnsq.optionfiles --write`` writes both;
``--check`` exits 1 when either differs from what the table gives (tests/test_optionspec.py
runs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .optionspec import CLIENTS, OPTIONS, SYNC_PRODUCER_PARAMETERS, Option

__all__ = ["render_docs", "render_typed_options", "written_files"]

ROOT = Path(__file__).resolve().parent.parent

_HEADER = '''"""The clients' keyword options as TypedDicts (PEP 692), for type checkers and editors.

WRITTEN by ``python -m fastnsq.optionfiles --write`` from the table in :mod:`fastnsq.optionspec`:
edit the table, not this file (tests/test_optionspec.py fails when they differ). Each key's
docstring gives its default and unit, and go-nsq's and pynsq's names for it.

>>> from fastnsq.typed_options import ConsumerOptions
>>> options: ConsumerOptions = {"max_in_flight": 20, "max_attempts": 3}
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from .backoff import BackoffStrategy
from .codec import Message

if TYPE_CHECKING:
    from .consumer.positions import ConsumeOffset
    from .producer.background import Unsent

__all__ = ["AsyncHandler", "BackoffStrategy", "Body", "ConsumerOptions", "Handler", "ProducerOptions",
           "SyncHandler", "SyncProducerOptions"]

#: What a publish takes as a message body (a str goes out as UTF-8).
Body = bytes | bytearray | memoryview | str

#: A plain handler: returns to finish the message, raises to have it held and handled again
#: (hold_failed; requeued with backoff when that is off); what it
#: returns is not read, so it is typed None (pynsq's ``return False`` would finish the message).
SyncHandler = Callable[[Message], None]
#: A coroutine handler: the same rules once it returns.
AsyncHandler = Callable[[Message], Awaitable[None]]
#: What ``Consumer(handler=...)`` takes.
Handler = SyncHandler | AsyncHandler
'''


def _key(option: Option) -> str:
    default = option.shown_default + (f" {option.unit}" if option.unit and option.default is not None else "")
    names = [f"go-nsq: {option.gonsq}" if option.gonsq else "fastnsq's own"]
    pynsq = [name for name in option.pynsq]
    if pynsq:
        names.append("pynsq: " + ", ".join(pynsq))
    doc = f"{option.doc} Default {default}; {'; '.join(names)}."
    return f"    {option.name}: {option.annotation}\n    \"\"\"{doc}\"\"\"\n"


def _typed_dict(name: str, bases: str, doc: str, options: list[Option]) -> str:
    body = "".join(_key(option) for option in options) or "    pass\n"
    return f"\n\nclass {name}({bases}, total=False):\n    \"\"\"{doc}\"\"\"\n\n{body}"


def render_typed_options() -> str:
    """The source of ``fastnsq/typed_options.py``."""
    connection = [o for o in OPTIONS if o.client == "connection"]
    consumer = [o for o in OPTIONS if o.client == "consumer"]
    producer = [o for o in OPTIONS if o.client == "producer" and o.name not in SYNC_PRODUCER_PARAMETERS]
    sync_only = [o for o in OPTIONS if o.client == "producer" and o.name in SYNC_PRODUCER_PARAMETERS]
    return "".join([
        _HEADER,
        _typed_dict("ConnectionKeywords", "TypedDict", "What every connection negotiates (both clients take these).",
                    connection),
        _typed_dict("ConsumerOptions", "ConnectionKeywords", "The keyword options of ``Consumer`` and "
                    "``fastnsq.sync.Consumer``.", consumer),
        _typed_dict("SyncProducerOptions", "ConnectionKeywords", "The keyword options of ``fastnsq.sync.Producer`` "
                    "(its own parameters aside).", producer),
        _typed_dict("ProducerOptions", "SyncProducerOptions", "The keyword options of ``Producer``.", sync_only),
    ])


_DOCS_HEADER = """# Options

Every keyword option of `Consumer`, `Producer` and their blocking twins in `fastnsq.sync`, from
the one table in `fastnsq/optionspec.py` (this page, the type checkers' `fastnsq.typed_options`
and the run-time checks are all read from it; `python -m fastnsq.optionfiles --write` writes
this page). Durations are seconds (`float`); from a string (the worker's TOML file and
environment, `--consumer-opt`, `fastnsq.options.parse_options`) they also take Go's form
(`"250ms"`, `"1m30s"`). An option fastnsq does not take is refused, with the name to use where
it is pynsq's or go-nsq's name for one of these:

```text
InvalidValueError: unknown Consumer option max_tries: pynsq's name; fastnsq calls it max_attempts
```
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(option: Option) -> str:
    accepted = ""
    if option.low is not None:
        accepted = f"{option.low:g}..{option.high:g}"
    elif option.choices:
        accepted = ", ".join(repr(choice) for choice in option.choices)
    pynsq = ", ".join(f"`{name}`" for name in option.pynsq)
    cells = [f"`{option.name}`", f"`{_cell(option.annotation)}`", _cell(option.shown_default), option.unit,
             _cell(accepted), f"`{option.gonsq}`" if option.gonsq else "", pynsq, _cell(option.doc)]
    return "| " + " | ".join(cells) + " |\n"


def _table(title: str, intro: str, options: list[Option]) -> str:
    head = "| option | type | default | unit | accepted | go-nsq | pynsq | what it does |\n|---|---|---|---|---|---|---|---|\n"
    return f"\n## {title}\n\n{intro}\n\n{head}{''.join(_row(option) for option in options)}"


def render_docs() -> str:
    """The text of ``docs/options.md``."""
    assert set(CLIENTS) == {"Consumer", "Producer"}
    return "".join([
        _DOCS_HEADER,
        _table("Consumer", "`fastnsq.Consumer(topic, channel, *, nsqd_tcp_addresses, lookupd_http_addresses, "
               "handler, **options)`; `fastnsq.sync.Consumer` takes the same, and `workers`.",
               [o for o in OPTIONS if o.client == "consumer"]),
        _table("Producer", "`fastnsq.Producer(nsqd_tcp_addresses, *, lookupd_http_addresses, **options)`; "
               "`fastnsq.sync.Producer` takes the same, and `thread_connections`.",
               [o for o in OPTIONS if o.client == "producer"]),
        _table("Connection (both clients)", "What each connection negotiates with nsqd (IDENTIFY, TLS, "
               "compression, AUTH); both clients take these.", [o for o in OPTIONS if o.client == "connection"]),
    ])


def written_files() -> dict[Path, str]:
    """Each file written from the table, with the text it must have."""
    return {ROOT / "fastnsq" / "typed_options.py": render_typed_options(), ROOT / "docs" / "options.md": render_docs()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastnsq.optionfiles", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="write the files")
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs from the table")
    args = parser.parse_args(argv)
    stale = [path for path, text in written_files().items() if not path.exists() or path.read_text() != text]
    if args.write:
        for path in stale:
            path.write_text(written_files()[path])
            print(f"wrote {path}")
        return 0
    for path in stale:
        print(f"{path} differs from fastnsq/optionspec.py: run python -m fastnsq.optionfiles --write")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
