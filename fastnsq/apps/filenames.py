"""The names ``fastnsq to-file`` gives its files, as nsq_to_file names them.

``--filename-format`` (default ``<TOPIC>.<HOST><REV>.<DATETIME>.log``): ``<TOPIC>``,
``<HOST>`` (the short hostname, or ``--host-identifier`` with ``<SHORT_HOST>`` /
``<HOSTNAME>``) and ``<PID>`` are replaced once; ``<DATETIME>`` at each file from
``--datetime-format`` (strftime, the codes nsq_to_file's strftime knows, local time); ``<REV>``
with ``-000000``, ``-000001``... when a file of that name exists. ``<REV>`` is required when
gzip, rotation or a work dir is on (a name may come back), and dropped otherwise. A compressed
file's name gets the format's suffix (``.gz``, ``.zst``) unless it has it already.
"""

from __future__ import annotations

import os
import re
import socket
import time

#: The strftime codes nsq_to_file converts (its copy of jehiah/go-strftime); any other
#: ``%x`` is written as it stands.
GO_STRFTIME_CODES = frozenset("BbmAadHIMSYypZz%")

_CODE = re.compile(r"%(.)", re.DOTALL)


class FilenameError(ValueError):
    """A --filename-format that cannot work with the other flags."""


def go_strftime(layout: str, when: float | None = None) -> str:
    """``layout`` formatted as nsq_to_file's strftime formats it (local time)."""
    moment = time.localtime(when)

    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if code not in GO_STRFTIME_CODES:
            return match.group(0)
        if code == "z":
            return time.strftime("%z", moment) or "+0000"
        return time.strftime("%" + code, moment)

    return _CODE.sub(one, layout)


def host_identifier(template: str = "") -> str:
    """``<HOST>``: the short hostname, or ``--host-identifier`` with its own tokens replaced."""
    hostname = socket.gethostname()
    short = hostname.split(".")[0]
    if not template:
        return short
    return template.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", hostname)


def compute_format(
    filename_format: str, topic: str, *, identifier: str, rev_needed: bool, suffix: str = "",
) -> str:
    """The per-topic format: everything but ``<DATETIME>`` and ``<REV>`` replaced."""
    if rev_needed and "<REV>" not in filename_format:
        raise FilenameError(
            f"--filename-format {filename_format!r}: missing <REV>, which is required when gzip, rotation "
            "(--rotate-size, --rotate-interval) or --work-dir is on (nsq_to_file's rule)")
    if not rev_needed:
        filename_format = filename_format.replace("<REV>", "")
    computed = (filename_format.replace("<TOPIC>", topic).replace("<HOST>", identifier)
                .replace("<PID>", str(os.getpid())))
    if suffix and not computed.endswith(suffix):
        computed += suffix
    return computed


def with_datetime(computed: str, datetime_format: str, when: float | None = None) -> str:
    return computed.replace("<DATETIME>", go_strftime(datetime_format, when))


def with_rev(name: str, rev: int) -> str:
    return name.replace("<REV>", f"-{rev:06d}")
