"""The ``fastnsq`` command, run as a subprocess (``python -m fastnsq``) against real servers.

The integration tests talk to the ``nsqd`` fixture (embedded, or the real nsqd of
FASTNSQ_TEST_NSQD), so the subprocess runs while the test's loop keeps serving:
they use asyncio subprocesses. The error cases need no server and run concurrently
in threads, once per module. Pure rendering (tables, the progress line, JSON
records) is tested in-process.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from fastnsq import __version__ as fastnsq_version
from fastnsq import cli
from fastnsq.benchmark import SCENARIOS
from fastnsq.cli.main import version_text
from fastnsq.codec import Message
from fastnsq.testing import EMBEDDED_HA_AVAILABLE, NSQD, AuthServer, authorization

from .helpers import skip_unless_without_tls, stats_json, tls_files, topic_entry, unique

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
ENV.pop("NSQ_AUTH_SECRET", None)
COMMAND = [sys.executable, "-m", "fastnsq"]


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return self.stderr.strip().splitlines()


async def fastnsq(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
                  timeout: float = 30.0) -> Outcome:
    """Run ``python -m fastnsq ARGS`` without blocking the loop the servers run on."""
    process = await asyncio.create_subprocess_exec(
        *COMMAND, *args,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or ENV,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout)
    assert process.returncode is not None
    return Outcome(process.returncode, out.decode(), err.decode())


def fastnsq_blocking(*args: str) -> Outcome:
    done = subprocess.run([*COMMAND, *args], check=False, capture_output=True, text=True, env=ENV,
                          timeout=60, stdin=subprocess.DEVNULL)
    return Outcome(done.returncode, done.stdout, done.stderr)


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def assert_ok(outcome: Outcome) -> None:
    assert outcome.returncode == 0, outcome.stderr
    assert "Traceback" not in outcome.stderr


# ---- help -------------------------------------------------------------------------------------

#: Options each command must document (a subset: the ones the issue names, and the go tools' flags).
DOCUMENTED = {
    "nsqd": ["--tcp-address", "--http-address", "--lookupd", "--lookupd-tcp-address", "--ha", "--tls-cert",
             "--tls-key", "--tls-required", "--auth-http-address", "--msg-timeout"],
    "pub": ["TOPIC", "BODY", "--topic", "--rate", "--count", "--nsqd-tcp-address", "--lookupd-http-address",
            "--tls", "--tls-root-ca-file", "--tls-cert", "--tls-key", "--tls-insecure-skip-verify",
            "--auth-secret", "NSQ_AUTH_SECRET", "--snappy", "--deflate", "--delimiter"],
    "tail": ["TOPIC", "--topic", "--channel", "-n", "--format", "raw", "json", "--max-in-flight",
             "--nsqd-tcp-address", "--lookupd-http-address", "--tls", "--auth-secret", "--snappy", "ephemeral"],
    "stats": ["--nsqd-http-address", "--lookupd-http-address", "--topic", "--channel", "--format", "--tls",
              "--auth-secret"],
    "bench": ["--nsqd-tcp-address", "--nsqd-http-address", "--workload", "--list", "--count", "--size",
              "--max-seconds", "--json"],
}


def test_top_level_help_lists_every_command() -> None:
    outcome = fastnsq_blocking("--help")
    assert_ok(outcome)
    for command in DOCUMENTED:
        assert f"\n    {command}" in outcome.stdout, command
    assert "--version" in outcome.stdout


@pytest.mark.parametrize("command", sorted(DOCUMENTED))
def test_each_command_help_documents_its_options(command: str) -> None:
    parser = cli.build_parser()
    sub = cli.subparser_of(parser, command)
    text = sub.format_help()
    for option in DOCUMENTED[command]:
        assert option in text, f"{command} --help does not mention {option}"
    for action in sub._actions:  # every option the parser accepts is in its help, with a description
        for flag in action.option_strings:
            assert flag in text, f"{command} --help does not list {flag}"
        if action.option_strings:
            assert action.help, f"{command} {action.option_strings[0]} has no help text"
    assert "--verbose" in text and "--debug" in text


@pytest.mark.parametrize("command", ["pub", "tail", "worker", "to-file", "to-nsq", "to-http", "to-postgres"])
def test_help_says_which_commands_need_a_server_address(command: str) -> None:
    """nsq's apps refuse to start without an address; the others use nsqd's default address."""
    text = " ".join(cli.subparser_of(cli.build_parser(), command).format_help().split())
    if command.startswith("to-"):
        assert "servers (at least one address is required)" in text and "127.0.0.1:4150" not in text
    else:
        assert "servers (default: --nsqd-tcp-address 127.0.0.1:4150)" in text


def test_version_and_python_dash_m_entry_point() -> None:
    """``python -m fastnsq --version``: the version, the codec in use (and why the Python one) and the loop."""
    outcome = fastnsq_blocking("--version")
    assert_ok(outcome)
    lines = outcome.stdout.splitlines()
    assert lines[0] == f"fastnsq {fastnsq_version}"
    if os.environ.get("FASTNSQ_NO_EXTENSIONS", "") not in ("", "0"):
        assert lines[1] == "codec: Python (chosen by FASTNSQ_NO_EXTENSIONS=1)"
    else:
        assert lines[1] == "codec: C"
    assert re.fullmatch(r"event loop: (uvloop \d+\.\d+\.\d+|asyncio \(.+\))", lines[2])
    assert lines[3].startswith(f"Python {sys.version.split()[0]} ")


def test_version_names_the_loop_it_would_run_on() -> None:
    assert version_text().splitlines()[2].startswith("event loop: uvloop ")
    done = subprocess.run([*COMMAND, "--version"], check=False, capture_output=True, text=True, timeout=60,
                          env=dict(ENV, FASTNSQ_NO_UVLOOP="1"), stdin=subprocess.DEVNULL)
    assert done.stdout.splitlines()[2] == "event loop: asyncio (FASTNSQ_NO_UVLOOP=1)"


# ---- bad input: one line, non-zero ----------------------------------------------------------

CLOSED = f"127.0.0.1:{free_port()}"

#: name -> (arguments, exit status, the command named in the line, words the line must contain).
#: Run as subprocesses: failures that happen once the command runs (and one usage error).
RUNTIME_ERRORS: dict[str, tuple[list[str], int, str, list[str]]] = {
    "pub unreachable nsqd": (["pub", "--nsqd-tcp-address", CLOSED, "events", "hi"], 1, "pub",
                             [CLOSED, "refused"]),
    "tail unreachable nsqd": (["tail", "--nsqd-tcp-address", CLOSED, "events"], 1, "tail",
                              ["cannot connect to nsqd", CLOSED]),
    "tail unreachable lookupd": (["tail", "--lookupd-http-address", CLOSED, "events"], 1, "tail",
                                 ["nsqlookupd", CLOSED]),
    "pub unreachable lookupd": (["pub", "--lookupd-http-address", CLOSED, "events", "hi"], 1, "pub",
                                ["nsqlookupd", CLOSED]),
    "stats unreachable nsqd": (["stats", "--nsqd-http-address", CLOSED], 1, "stats", ["nsqd", CLOSED]),
    "stats unreachable lookupd": (["stats", "--lookupd-http-address", CLOSED], 1, "stats", ["nsqlookupd", CLOSED]),
    "bench unreachable nsqd": (["bench", "--nsqd-tcp-address", CLOSED, "--workload", "pub"], 1, "bench",
                               ["cannot connect to nsqd", CLOSED]),
    "invalid topic": (["pub", "bad topic!", "hi"], 2, "pub", ["invalid topic name", "'bad topic!'"]),
}

#: Usage errors, found before anything runs: tested in-process through cli.main (same path, no start-up cost).
USAGE_ERRORS: dict[str, tuple[list[str], int, str, list[str]]] = {
    "address without port": (["pub", "--nsqd-tcp-address", "localhost", "events", "hi"], 2, "pub",
                             ["--nsqd-tcp-address", "host:port"]),
    "address with a bad port": (["tail", "--nsqd-tcp-address", "127.0.0.1:99999", "events"], 2, "tail",
                                ["--nsqd-tcp-address", "99999"]),
    "bad lookupd address": (["stats", "--lookupd-http-address", "ftp://x:1"], 2, "stats",
                            ["--lookupd-http-address", "ftp://x:1"]),
    "invalid topic option": (["tail", "--topic", "x" * 65], 2, "tail", ["--topic", "invalid topic name"]),
    "invalid stats topic": (["stats", "--topic", "a b"], 2, "stats", ["--topic", "invalid topic name"]),
    "invalid channel": (["tail", "events", "--channel", "a/b"], 2, "tail", ["--channel", "invalid channel name"]),
    "missing topic": (["tail"], 2, "tail", ["TOPIC is required"]),
    "topic given twice": (["tail", "a", "--topic", "b"], 2, "tail", ["topic is given twice"]),
    "rate not a number": (["pub", "events", "hi", "--rate", "fast"], 2, "pub", ["--rate", "'fast'"]),
    "rate not positive": (["pub", "events", "hi", "--rate", "0"], 2, "pub", ["--rate", "positive"]),
    "count below 1": (["pub", "events", "hi", "--count", "0"], 2, "pub", ["--count", "minimum 1"]),
    "negative -n": (["tail", "events", "-n", "-3"], 2, "tail", ["-n", "-3"]),
    "bad format": (["tail", "events", "--format", "xml"], 2, "tail", ["--format", "'xml'"]),
    "bad delimiter": (["pub", "events", "--delimiter", "ab"], 2, "pub", ["--delimiter", "single byte"]),
    "missing tls file": (["pub", "events", "hi", "--tls-root-ca-file", "/nonexistent/ca.pem"], 2, "pub",
                         ["--tls-root-ca-file", "/nonexistent/ca.pem"]),
    "tls cert without key": (["pub", "events", "hi", "--tls-cert", __file__], 2, "pub", ["--tls-cert", "--tls-key"]),
    "snappy and deflate": (["pub", "events", "hi", "--snappy", "--deflate"], 2, "pub", ["--snappy", "--deflate"]),
    "deflate level": (["tail", "events", "--deflate", "--deflate-level", "12"], 2, "tail", ["deflate_level", "12"]),
    "empty body": (["pub", "events", ""], 2, "pub", ["BODY is empty"]),
    "unknown workload": (["bench", "--workload", "nope"], 2, "bench", ["--workload", "'nope'"]),
    "unknown worker flag": (["worker", "m:f", "--topic", "t", "--chanel", "c"], 2, "worker",
                            ["unrecognized arguments: --chanel c"]),
    "worker log level": (["worker", "m:f", "--topic", "t", "--channel", "c", "--log-level", "loud"], 2, "worker",
                         ["--log-level", "'loud'", "DEBUG, INFO, WARNING, ERROR"]),
    "to-file log level": (["to-file", "--topic", "t", "--output-dir", "/tmp", "--log-level", "loud"], 2, "to-file",
                          ["--log-level", "'loud'", "debug"]),
    "unknown pub flag": (["pub", "events", "hi", "--bogus"], 2, "pub", ["unrecognized arguments: --bogus"]),
    "unknown to-file flag": (["to-file", "--topic", "t", "--output-dirr", "/tmp"], 2, "to-file",
                             ["unrecognized arguments: --output-dirr /tmp"]),
    "unknown command": (["frobnicate"], 2, "", ["'frobnicate'"]),
    "no command": ([], 2, "", ["COMMAND"]),
    "nsqd bad listen address": (["nsqd", "--tcp-address", "127.0.0.1"], 2, "nsqd", ["--tcp-address"]),
    "nsqd hosts differ": (["nsqd", "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.2:0"], 2, "nsqd",
                          ["same host"]),
}
if not EMBEDDED_HA_AVAILABLE:
    RUNTIME_ERRORS["nsqd --ha not built"] = (["nsqd", "--ha"], 2, "nsqd", ["--ha", "HA dialect"])


def assert_one_error_line(outcome: Outcome, status: int, command: str, words: list[str]) -> None:
    assert outcome.returncode == status, outcome
    assert len(outcome.error_lines) == 1, f"expected one line on stderr, got:\n{outcome.stderr}"
    line = outcome.error_lines[0]
    assert line.startswith(f"fastnsq{' ' + command if command else ''}: error: "), line
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    assert outcome.stdout == ""


@pytest.fixture(scope="module")
def runtime_outcomes() -> dict[str, Outcome]:
    """Every subprocess error case, run concurrently (no server involved), once for the module."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(fastnsq_blocking, *case[0]) for name, case in RUNTIME_ERRORS.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", sorted(RUNTIME_ERRORS))
def test_failure_is_one_line_and_a_nonzero_exit(case: str, runtime_outcomes: dict[str, Outcome]) -> None:
    _, status, command, words = RUNTIME_ERRORS[case]
    assert_one_error_line(runtime_outcomes[case], status, command, words)


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_bad_usage_is_one_line_and_exit_status_2(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    args, status, command, words = USAGE_ERRORS[case]
    try:
        code = cli.main(args)
    except SystemExit as exit_:
        code = exit_.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert_one_error_line(Outcome(code, out, err), status, command, words)


async def test_nsqd_address_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        outcome = await fastnsq("nsqd", "--tcp-address", f"127.0.0.1:{port}", "--http-address", "127.0.0.1:0")
    assert outcome.returncode == 1
    assert len(outcome.error_lines) == 1, outcome.stderr
    assert outcome.error_lines[0].startswith("fastnsq nsqd: error: ")
    assert str(port) in outcome.error_lines[0] and "in use" in outcome.error_lines[0]


async def test_debug_adds_the_traceback() -> None:
    outcome = await fastnsq("tail", "--debug", "--nsqd-tcp-address", CLOSED, "events")
    assert outcome.returncode == 1
    assert "Traceback" in outcome.stderr
    assert outcome.error_lines[-1].startswith("fastnsq tail: error: cannot connect to nsqd")


# ---- pub and tail ---------------------------------------------------------------------------


async def test_pub_then_tail_round_trip(nsqd) -> None:
    topic = unique("cli")
    address = nsqd.tcp_address
    first = await fastnsq("pub", "--nsqd-tcp-address", address, topic, "héllo")
    assert_ok(first)
    assert f"published 1 message to {topic}" in first.stdout
    lines = await fastnsq("pub", "--nsqd-tcp-address", address, "--topic", topic, "-",
                          stdin=b"one\n\ntwo\n\xff\xfebinary\nthree")  # empty line skipped, no final newline
    assert_ok(lines)
    assert f"published 4 messages to {topic}" in lines.stdout

    tail = await fastnsq("tail", "--nsqd-tcp-address", address, topic, "-n", "5", "--format", "json")
    assert_ok(tail)
    records = [json.loads(line) for line in tail.stdout.splitlines()]
    assert len(records) == 5
    texts = sorted(r["body"] for r in records if "body" in r)
    assert texts == sorted(["héllo", "one", "two", "three"])
    (binary,) = [r for r in records if "body_base64" in r]
    assert base64.b64decode(binary["body_base64"]) == b"\xff\xfebinary"
    for record in records:
        assert record["attempts"] == 1
        assert len(record["id"]) == 16 and int(record["id"], 16) >= 0
        assert record["timestamp"] > 1_600_000_000 * 10**9  # ns since the epoch


async def test_tail_raw_prints_bodies_and_waits_for_new_messages(nsqd) -> None:
    topic = unique("cli")
    tail = asyncio.create_task(fastnsq("tail", "--nsqd-tcp-address", nsqd.tcp_address, topic, "-n", "3"))
    await asyncio.sleep(1.0)  # let it subscribe; messages published before would wait in the topic anyway
    assert not tail.done()
    assert_ok(await fastnsq("pub", "--nsqd-tcp-address", nsqd.tcp_address, topic, "-", stdin=b"a\nb\nc\nd\n"))
    outcome = await asyncio.wait_for(tail, 30)
    assert_ok(outcome)
    assert outcome.stdout.splitlines() == ["a", "b", "c"]


async def test_pub_count_and_rate(nsqd) -> None:
    if not nsqd.http_address:
        pytest.skip("reads the topic's message count over HTTP: FASTNSQ_TEST_NSQD_HTTP is not set")
    topic = unique("cli")
    outcome = await fastnsq("pub", "--nsqd-tcp-address", nsqd.tcp_address, topic, "tick", "--count", "20",
                            "--rate", "100")
    assert_ok(outcome)
    seconds = float(outcome.stdout.split(" in ")[1].split()[0])
    assert seconds >= 0.18  # 20 messages at 100/s: the last goes out 0.19 s after the first
    stats = await stats_json(nsqd.http_address, topic)
    assert topic_entry(stats, topic)["message_count"] == 20


async def test_pub_lines_in_batches_and_count_limit(nsqd) -> None:
    if not nsqd.http_address:
        pytest.skip("reads the topic's message count over HTTP: FASTNSQ_TEST_NSQD_HTTP is not set")
    topic = unique("cli")
    body = b"".join(b"line %d\n" % i for i in range(5000))
    outcome = await fastnsq("pub", "--nsqd-tcp-address", nsqd.tcp_address, topic, "--count", "3210", "-q",
                            stdin=body)
    assert_ok(outcome)
    assert outcome.stdout == ""
    stats = await stats_json(nsqd.http_address, topic)
    assert topic_entry(stats, topic)["message_count"] == 3210


async def test_tls_compression_and_auth_from_the_environment() -> None:
    files = tls_files()
    secret = "s3cret-" + unique("x")
    async with AuthServer({secret: ("cli-tester", [authorization()])}) as auth, NSQD(
        tls_cert=files.server_cert, tls_key=files.server_key, tls_required=True, auth_http_addresses=[auth.address]
    ) as server:
        topic = unique("cli")
        tls = ["--nsqd-tcp-address", server.tcp_address, "--tls-root-ca-file", files.ca]
        env = dict(ENV, NSQ_AUTH_SECRET=secret)
        assert_ok(await fastnsq("pub", *tls, "--snappy", topic, "secure", env=env))
        tail = await fastnsq("tail", *tls, "--deflate", topic, "-n", "1", env=env)
        assert_ok(tail)
        assert tail.stdout == "secure\n"
        assert auth.requests and {request.identity for request in auth.requests} == {"cli-tester"}
        assert secret not in tail.stderr

        refused = await fastnsq("tail", *tls, topic, "-n", "1", "--auth-secret", "wrong", env=ENV)
        assert refused.returncode == 1
        assert len(refused.error_lines) == 1 and "E_AUTH_FAILED" in refused.stderr
        assert "wrong" not in refused.stderr
        bench = await fastnsq("bench", *tls, "--workload", "pub", "--count", "500", env=env)
        assert_ok(bench)
        assert bench.stdout.splitlines()[1].split()[:3] == ["pub", "coalesce", "on"]

        unverified = await fastnsq("pub", "--nsqd-tcp-address", server.tcp_address, "--tls", topic, "x",
                                   env=env)
        assert unverified.returncode == 1
        assert len(unverified.error_lines) == 1 and "certificate" in unverified.stderr.lower()


async def test_tls_asked_for_but_not_offered_is_an_error(nsqd) -> None:
    await skip_unless_without_tls(nsqd)
    for command in (["pub", "--nsqd-tcp-address", nsqd.tcp_address, "--tls", unique("cli"), "x"],
                    ["tail", "--nsqd-tcp-address", nsqd.tcp_address, "--tls-insecure-skip-verify", unique("cli")]):
        outcome = await fastnsq(*command)
        assert_one_error_line(outcome, 1, command[0], ["does not offer TLS", nsqd.tcp_address])


# ---- stats ------------------------------------------------------------------------------------


async def test_stats_shows_topics_and_channels(nsqd) -> None:
    if not nsqd.http_address:
        pytest.skip("FASTNSQ_TEST_NSQD_HTTP is not set")
    topic = unique("cli")
    assert_ok(await fastnsq("pub", "--nsqd-tcp-address", nsqd.tcp_address, topic, "-", stdin=b"1\n2\n3\n"))
    async with aiohttp.ClientSession() as session:
        url = f"http://{nsqd.http_address}/channel/create?topic={topic}&channel=archive"
        async with session.post(url) as response:
            assert response.status == 200
    outcome = await fastnsq("stats", "--nsqd-http-address", nsqd.http_address, "--topic", topic)
    assert_ok(outcome)
    header, topic_row, channel_row = outcome.stdout.splitlines()
    assert header.split()[:4] == ["TOPIC", "CHANNEL", "DEPTH", "IN-FLIGHT"]
    assert topic_row.split()[:2] == [topic, "-"]
    assert channel_row.split()[:2] == ["archive", "3"]  # the 3 messages moved to the new channel
    as_json = await fastnsq("stats", "--nsqd-http-address", nsqd.http_address, "--topic", topic, "--format", "json")
    assert_ok(as_json)
    (node,) = json.loads(as_json.stdout).values()
    assert node["topics"][0]["topic_name"] == topic
    assert node["topics"][0]["channels"][0]["depth"] == 3


async def test_nsqd_command_with_lookupd_stats_through_lookupd_and_sigterm() -> None:
    process = await asyncio.create_subprocess_exec(
        *COMMAND, "nsqd", "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--lookupd",
        "--lookupd-tcp-port", "0", "--lookupd-http-port", "0",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
    )
    try:
        assert process.stdout is not None
        lines = []
        while not lines or not lines[-1].startswith("running"):
            line = (await asyncio.wait_for(process.stdout.readline(), 20)).decode()
            assert line, "fastnsq nsqd exited early"
            lines.append(line)
        nsqd_words = next(line.split() for line in lines if line.startswith("nsqd "))
        lookupd_words = next(line.split() for line in lines if line.startswith("nsqlookupd "))
        tcp, http, lookupd_http = nsqd_words[2], nsqd_words[4], lookupd_words[4]

        topic = unique("cli")
        assert_ok(await fastnsq("pub", "--nsqd-tcp-address", tcp, topic, "hello"))
        assert_ok(await fastnsq("pub", "--lookupd-http-address", lookupd_http, topic, "via lookupd"))
        await asyncio.sleep(0.3)  # nsqd registers the topic with the lookupd
        outcome = await fastnsq("stats", "--lookupd-http-address", lookupd_http)
        assert_ok(outcome)
        (row,) = [line for line in outcome.stdout.splitlines() if topic in line]
        assert row.split()[:3] == [topic, "-", "2"]
        tail = await fastnsq("tail", "--lookupd-http-address", lookupd_http, topic, "-n", "2")
        assert_ok(tail)
        assert sorted(tail.stdout.splitlines()) == ["hello", "via lookupd"]
        assert http.startswith("127.0.0.1:")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        rest, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0, err.decode()
    assert rest.decode().strip().endswith("stopped")
    assert b"Traceback" not in err


# ---- bench ------------------------------------------------------------------------------------


async def test_bench_runs_workloads_with_progress_and_table(nsqd, tmp_path: Path) -> None:
    results = tmp_path / "bench.json"
    args = ["bench", "--nsqd-tcp-address", nsqd.tcp_address, "--workload", "pub", "--workload", "consume",
            "--count", "3000", "--json", str(results)]
    if nsqd.http_address:
        args += ["--nsqd-http-address", nsqd.http_address]
    outcome = await fastnsq(*args, timeout=60)
    assert_ok(outcome)
    header, *rows = outcome.stdout.splitlines()
    assert header.split()[:5] == ["WORKLOAD", "VARIANT", "MESSAGES", "SECONDS", "MSG/S"]
    assert [row.split()[0] for row in rows] == ["pub", "consume"]
    # The timed window opens at the first acknowledgement past the warm-up; acks come in
    # batches, so it measures up to one batch fewer than --count (and says how many).
    measured = re.findall(r"^(pub|consume): ([\d,]+) messages in", outcome.stderr, re.MULTILINE)
    assert [name for name, _ in measured] == ["pub", "consume"]
    assert all(2800 <= int(n.replace(",", "")) <= 3000 for _, n in measured)
    data = json.loads(results.read_text())
    assert [entry["workload"] for entry in data] == ["pub", "consume"]
    assert all(2800 <= entry["messages"] <= 3000 and entry["msgs_per_s"] > 0 for entry in data)


def test_bench_list() -> None:
    outcome = fastnsq_blocking("bench", "--list")
    assert_ok(outcome)
    assert [line.split()[0] for line in outcome.stdout.splitlines()[1:]] == list(SCENARIOS)


# ---- rendering (no servers) -------------------------------------------------------------------


def test_format_table_aligns_numbers_right_and_text_left() -> None:
    text = cli.format_table(["NAME", "COUNT", "RATE"], [["a", 1234567, "1.50"], ["longer", 3, ""]])
    assert text.splitlines() == [
        "NAME        COUNT  RATE",
        "a       1,234,567  1.50",
        "longer          3",
    ]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_rewrites_itself_on_a_terminal() -> None:
    screen = _Terminal()
    progress = cli.ProgressLine(screen, interval=0)
    progress.update("pub", 25, 100, "10 msg/s")
    progress.update("pub", 50, 100, "20 msg/s")
    assert "\n" not in screen.getvalue()
    assert screen.getvalue().count("\r\x1b[K") == 2
    progress.done("pub: done")
    assert screen.getvalue().endswith("\r\x1b[Kpub: done\n")
    assert "[#####               ]  25%  25/100  10 msg/s" in screen.getvalue()


def test_progress_line_prints_plain_lines_when_not_a_terminal() -> None:
    log = io.StringIO()
    progress = cli.ProgressLine(log, interval=3600)  # throttled: only the first and forced updates show
    progress.update("consume", 1, 10)
    progress.update("consume", 2, 10)
    progress.update("consume", 10, 10, force=True)
    progress.done("consume: done")
    assert log.getvalue().splitlines() == [
        "consume  [##                  ]  10%  1/10",
        "consume  [####################] 100%  10/10",
        "consume: done",
    ]
    assert "\r" not in log.getvalue()


def test_message_record_text_binary_and_ha_ids() -> None:
    text = cli.message_record(Message(1_700_000_000_000_000_000, 2, b"0a1b2c3d4e5f6071", b"caf\xc3\xa9"))
    assert text == {"id": "0a1b2c3d4e5f6071", "attempts": 2, "timestamp": 1_700_000_000_000_000_000, "body": "café"}
    binary = cli.message_record(Message(1, 1, bytes(range(16)), b"\x00\xff"))
    assert binary["id"] == bytes(range(16)).hex()
    assert binary["body_base64"] == base64.b64encode(b"\x00\xff").decode()
    assert "body" not in binary


def test_stats_rows_per_node_when_several() -> None:
    stats = {"topics": [{"topic_name": "t", "depth": 0, "message_count": 9, "paused": True,
                         "channels": [{"channel_name": "c", "depth": 4, "in_flight_count": 1, "deferred_count": 2,
                                       "requeue_count": 3, "timeout_count": 5, "message_count": 9,
                                       "client_count": 2}]}]}
    rows = cli.stats_rows({"a:4151": stats, "b:4151": {"topics": None}}, show_node=True)
    assert rows == [["a:4151", "t (paused)", "-", 0, "", "", "", "", 9, ""],
                    ["", "", "c", 4, 1, 2, 3, 5, 9, 2]]


async def test_consumer_and_producer_options_pass_through(nsqd) -> None:
    """go's --consumer-opt / --producer-opt: any option by go-nsq's name, typed and checked."""
    topic = unique("cliopts")
    assert_ok(await fastnsq("pub", "--nsqd-tcp-address", nsqd.tcp_address, topic, "-",
                            "--producer-opt", "pool_size=2", "--producer-opt", "publish_timeout,5s",
                            stdin=b"a\nb\n"))
    outcome = await fastnsq("tail", "--nsqd-tcp-address", nsqd.tcp_address, topic, "-n", "2",
                            "--consumer-opt", "msg_timeout=90s", "--consumer-opt", "backoff_strategy=full_jitter")
    assert_ok(outcome)
    assert outcome.stdout.splitlines() == ["a", "b"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pub", "t", "x", "--producer-opt", "pool_size=two"], "--producer-opt: option pool_size='two': takes a whole number"),
        (["tail", "t", "--consumer-opt", "max_in_flight"], "--consumer-opt: an option is 'name=value'"),
        (["tail", "t", "--consumer-opt", "pool_size=2"], "--consumer-opt: unknown Consumer option pool_size: a Producer option"),
    ],
)
async def test_bad_passthrough_options_are_named(args: list[str], message: str) -> None:
    outcome = await fastnsq(*args)
    assert outcome.returncode == 2, outcome.stderr
    assert message in outcome.stderr and "Traceback" not in outcome.stderr
