"""Helpers for integration tests: unique names, TLS material, small waits."""

from __future__ import annotations

import asyncio
import itertools
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pytest
import trustme

from fastnsq.testing import is_external

_counter = itertools.count()


def unique(prefix: str = "t") -> str:
    """A topic/channel name no other test (or earlier run against a real nsqd) uses."""
    return f"{prefix}_{os.getpid()}_{next(_counter)}_{os.urandom(3).hex()}"


def skip_if_external(server: Any, why: str) -> None:
    if is_external(server):
        pytest.skip(f"needs an embedded server: {why}")


@dataclass(frozen=True)
class TlsFiles:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA that signed nothing here: verification against it must fail


@lru_cache(maxsize=1)
def tls_files() -> TlsFiles:
    """A test CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    folder = tempfile.mkdtemp(prefix="fastnsq-tls-")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("fastnsq-test-client")
    other = trustme.CA()

    def write(name: str, blob: Any) -> str:
        path = os.path.join(folder, name)
        blob.write_to_path(path)
        return path

    return TlsFiles(
        ca=write("ca.pem", ca.cert_pem),
        server_cert=write("server.pem", server.cert_chain_pems[0]),
        server_key=write("server.key", server.private_key_pem),
        client_cert=write("client.pem", client.cert_chain_pems[0]),
        client_key=write("client.key", client.private_key_pem),
        other_ca=write("other-ca.pem", other.cert_pem),
    )


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0, what: str = "") -> None:
    """Wait until ``check()`` is true (polling), or fail the test."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        await asyncio.sleep(0.02)


def is_tls_failure(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, ssl.SSLError):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False
