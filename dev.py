#!/usr/bin/env python3
"""Set everything up, then run the demo or the tests. Needs only Python 3 and a C compiler.

    python3 dev.py demo     # venv + install + embedded nsqd + a real publish/consume run
    python3 dev.py test     # venv + install + the test suite, with both codec implementations
    python3 dev.py bench    # venv + install + the benchmark report in bench/
    python3 dev.py bench --real ~/nsq-real/bin   # the same against a real nsqd, with go-nsq's tools
    python3 dev.py docs     # venv + install + the documentation site, built strictly into docs/_build/html
    python3 dev.py docs --serve [PORT]      # ... then served on http://127.0.0.1:PORT/ (8000)

    python3 dev.py test --real BIN_DIR      # the suite against real nsqd/nsqlookupd from BIN_DIR
    python3 dev.py test --real-ha BIN_DIR   # the HA tests against a real youzan cluster (etcd from PATH)
    python3 dev.py captures --real BIN_DIR  # record a real nsqd's answers into tests/captures

Real servers: BIN_DIR holds nsqd and nsqlookupd (docs/testing.md#getting-the-binaries);
FASTNSQ_REAL_BIN=BIN_DIR adds the real pass to a plain `dev.py test`. youzan's HA binaries
(nsqd, nsqlookupd, built from youzan/nsq) go with --real-ha BIN_DIR or
FASTNSQ_REAL_HA_BIN=BIN_DIR; --base-port N puts the HA cluster on ports N, N+1, ...

Idempotent: the virtualenv lives in .venv and is only reinstalled when the build inputs
change (pyproject.toml, setup.py, the Cython sources).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BUILD_INPUTS = [
    "pyproject.toml", "setup.py", "fastnsq/_frame.pyx", "fastnsq/_frame.pxd", "fastnsq/_coalesce.pyx",
    "fastnsq/_delivery.pyx", "fastnsq/_blocking.pyx",
]
EXTRAS = "test,testing,bench,spark,docs"
EXTENSIONS = ("_frame", "_coalesce", "_delivery", "_blocking")
#: Every Python the package claims (pyproject's requires-python and classifiers). The full
#: suite runs on the interpreter that runs dev.py; the others get the smoke pass below.
SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
SMOKE_EXTRAS = "test,testing"
#: The smoke pass on the other Pythons: the README's and the documentation's examples, the
#: codec both ways, fastnsq.run, the connection, consumer and producer, and the fault
#: scenarios (those marked slow run in the main pass only).
SMOKE_TESTS = [
    "tests/test_loop.py", "tests/test_readme.py", "tests/test_docs_examples.py", "tests/test_codec.py",
    "tests/test_codec_properties.py",
    "tests/test_conn.py", "tests/test_consumer.py", "tests/test_producer.py", "tests/test_faults.py",
    "tests/test_rdy.py", "tests/test_hostile.py",
]
REAL_BIN_ENV = "FASTNSQ_REAL_BIN"
REAL_HA_BIN_ENV = "FASTNSQ_REAL_HA_BIN"
#: What runs against a real HA cluster: the HA tests, the conformance tests of the
#: embedded HA servers, and the leader-kill test (on a real cluster of its own).
HA_TESTS = ["tests/test_ha.py", "tests/test_embedded_ha.py", "tests/test_ha_failover.py", "tests/test_ha_positions.py",
            "tests/test_ha_bodies.py", "tests/test_youzan_interop.py",
            "tests/test_ha_endpoints.py", "tests/test_ha_producer.py",
            "tests/test_ha_tags.py", "tests/test_ha_fins.py", "tests/test_otel.py", "tests/test_partitions.py",
            "tests/test_spark_offsets.py", "tests/test_spark_ha.py", "tests/test_apps_to_nsq_ha.py",
            "tests/test_metrics_partitions.py"]


def venv_python(venv_dir: Path = VENV) -> Path:
    return venv_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def build_hash(extras: str = EXTRAS) -> str:
    digest = hashlib.sha256(extras.encode())
    for name in BUILD_INPUTS:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def run(*cmd: object, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True, env=env)


def setup(venv_dir: Path = VENV, base_python: str | None = None, extras: str = EXTRAS) -> Path:
    """Create ``venv_dir`` and install fastnsq (editable, C extension built in place) once.

    ``base_python`` is the interpreter the virtualenv is made from (this one by default).
    """
    python = venv_python(venv_dir)
    if not python.exists():
        print(f"creating {venv_dir}", flush=True)
        if base_python is None:
            venv.EnvBuilder(with_pip=True).create(venv_dir)
        else:
            run(base_python, "-m", "venv", venv_dir)
    stamp_file = venv_dir / ".fastnsq-install-stamp"
    stamp = build_hash(extras)
    tag = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    built_all = all((ROOT / "fastnsq" / f"{name}{tag}").exists() for name in EXTENSIONS)
    if stamp_file.exists() and stamp_file.read_text() == stamp and built_all:
        return python
    run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip", "setuptools", "wheel", "Cython>=3.0")
    run(python, "-m", "pip", "install", "--quiet", "-e", f".[{extras}]")
    # The editable install compiles the extension; make sure it sits next to the sources.
    run(python, "setup.py", "--quiet", "build_ext", "--inplace")
    stamp_file.write_text(stamp)
    return python


def demo(python: Path, args: list[str]) -> None:
    run(python, "-m", "fastnsq.demo", *args)


def take_real(args: list[str], flag: str = "--real", env: str = REAL_BIN_ENV) -> tuple[Path | None, list[str]]:
    """``--real BIN_DIR`` out of ``args`` (else ``FASTNSQ_REAL_BIN``), and the rest."""
    rest = list(args)
    if flag in rest:
        at = rest.index(flag)
        if at + 1 >= len(rest):
            raise SystemExit(f"{flag} needs the folder with the real nsqd and nsqlookupd binaries")
        folder = rest[at + 1]
        del rest[at : at + 2]
        return Path(folder).expanduser().resolve(), rest
    from_env = os.environ.get(env, "").strip()
    return (Path(from_env).expanduser().resolve() if from_env else None), rest


#: The embedded passes spend most of their time waiting on sockets and timers (measured: the
#: Python-codec pass used 7 % of one core over 7 min 8 s; 4-wide it took 2 min 23 s). Tests
#: that share nsqd's default ports are one xdist group; Spark (JVMs, executors killed on
#: cue) and the long fault scenarios run alone, after.
PARALLEL = ["-n", "4", "--dist", "loadgroup"]
SERIAL_MARKS = "spark or slow"


def pytest_passes(python: Path, args: list[str], prefix: list[object]) -> None:
    """The suite with the C codec, then the integration tests again on the Python twin.

    On the embedded servers (no ``prefix``) with no tests named, each pass runs 4-wide but
    for the serial marks; against real servers everything runs one test at a time.
    """
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    parallel = not prefix and not names_tests(args) and not any(a == "-m" or a.startswith("-m") for a in args)
    if parallel:
        run(*pytest, "-m", f"not ({SERIAL_MARKS})", *PARALLEL, *args)
        run(*pytest, "-m", SERIAL_MARKS, *args)
    else:
        run(*prefix, *pytest, *args)
    env = dict(os.environ, FASTNSQ_NO_EXTENSIONS="1")
    twin_pass = "not spark and not slow and not docs"  # the docs are built once, in the first pass
    run(*prefix, *pytest, "-m", twin_pass, *(PARALLEL if parallel else []), *args, env=env)


def test(python: Path, args: list[str]) -> None:
    """The embedded pass, and a real pass for each folder of real binaries given.

    ``--real`` / ``--real-ha`` run only their real pass; ``FASTNSQ_REAL_BIN`` /
    ``FASTNSQ_REAL_HA_BIN`` add theirs to the embedded one. The HA pass runs the
    HA tests (``HA_TESTS``, with any pytest options given) unless test files are named.
    """
    explicit = {"--real", "--real-ha"} & set(args)
    ha_bin, args = take_real(args, "--real-ha", REAL_HA_BIN_ENV)
    base_port, args = take_option(args, "--base-port")
    real_bin, rest = take_real(args)
    if not explicit:
        pytest_passes(python, rest, [])
        if not names_tests(rest):
            smoke_other_pythons(rest)
    if ha_bin is not None:
        print(f"real HA pass: youzan nsqd and nsqlookupd from {ha_bin}, etcd from PATH", flush=True)
        runner: list[object] = [python, "-m", "fastnsq.testing.real", ha_bin, "--ha"]
        if base_port:
            runner += ["--base-port", base_port]
        # Options alone (say -rs) go with the HA tests; file or test names replace them.
        chosen = rest if names_tests(rest) else [*HA_TESTS, *rest]
        pytest_passes(python, chosen, [*runner, "--"])
    if real_bin is None:
        if explicit:
            return
        print(
            "real-server pass: skipped: no real nsqd binaries given "
            f"(python3 dev.py test --real BIN_DIR, or {REAL_BIN_ENV}=BIN_DIR; how to get them: "
            "docs/testing.md#getting-the-binaries); the suite ran on the embedded servers only",
            flush=True,
        )
        return
    print(f"real-server pass: nsqd and nsqlookupd from {real_bin}", flush=True)
    pytest_passes(python, rest, [python, "-m", "fastnsq.testing.real", real_bin, "--"])


def names_tests(args: list[str]) -> bool:
    """Whether pytest arguments name test files or tests (then only those run)."""
    return any(not arg.startswith("-") for arg in args)


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` ("3.10"): pyenv's newest of that line, else one on PATH."""
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = sorted(
        (pyenv_root / "versions").glob(f"{version}.*/bin/python{version}"),
        key=lambda p: [int(part) if part.isdigit() else -1 for part in p.parts[-3].split(".")],
    )
    if candidates:
        return str(candidates[-1])
    return shutil.which(f"python{version}")


def smoke_other_pythons(args: list[str]) -> None:
    """The smoke pass (SMOKE_TESTS) on every supported Python other than this one.

    Each gets a virtualenv of its own (``.venv-3.X``, kept between runs like ``.venv``). A
    Python the machine does not have is reported and skipped; a failing one fails the run
    after the others have had their turn.
    """
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    outcomes: dict[str, str] = {this: "full suite (above)"}
    for version in SUPPORTED_PYTHONS:
        if version == this:
            continue
        base = find_python(version)
        if base is None:
            outcomes[version] = "SKIPPED: no python" + version + " found (pyenv versions or PATH)"
            print(f"python {version}: {outcomes[version]}", flush=True)
            continue
        print(f"python {version}: smoke pass with {base}", flush=True)
        try:
            python = setup(ROOT / f".venv-{version}", base, SMOKE_EXTRAS)
            run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *PARALLEL, *SMOKE_TESTS,
                *args)
            outcomes[version] = "smoke pass passed"
        except subprocess.CalledProcessError as exc:
            outcomes[version] = f"FAILED (exit {exc.returncode})"
    print("pythons:", flush=True)
    for version in SUPPORTED_PYTHONS:
        print(f"  {version}: {outcomes.get(version, 'not run')}", flush=True)
    failed = [v for v, outcome in outcomes.items() if outcome.startswith("FAILED")]
    if failed:
        raise subprocess.CalledProcessError(1, f"smoke pass on Python {', '.join(failed)}")


def take_option(args: list[str], flag: str) -> tuple[str | None, list[str]]:
    """``flag VALUE`` out of ``args``, and the rest."""
    rest = list(args)
    if flag not in rest:
        return None, rest
    at = rest.index(flag)
    if at + 1 >= len(rest):
        raise SystemExit(f"{flag} needs a value")
    value = rest[at + 1]
    del rest[at : at + 2]
    return value, rest


def captures(python: Path, args: list[str]) -> None:
    """Record a real nsqd's answers into tests/captures from fresh real servers.

    The released v1.3.0 goes to ``nsqd-v1.3.0``, nsq master to ``nsqd-master`` (the real
    harness tells them apart by ``nsqd --help``); either replays the client side of
    ``nsqd-master``, so a master recording replaces its own reference.
    """
    real_bin, rest = take_real(args)
    if real_bin is None:
        raise SystemExit("captures needs --real BIN_DIR: the folder with real nsqd and nsqlookupd binaries")
    record = (
        "import os, sys; from tests.captures import record; "
        "emulates = os.environ['FASTNSQ_TEST_NSQD_EMULATES']; "
        "folder = 'nsqd-master' if emulates == 'master' else 'nsqd-v1.3.0'; "
        "server = 'nsq master' if emulates == 'master' else 'nsqd v1.3.0 (released)'; "
        "record.main(['--nsqd-tcp', os.environ['FASTNSQ_TEST_NSQD'], '--nsqd-http', os.environ['FASTNSQ_TEST_NSQD_HTTP'], "
        "'--lookupd-http', os.environ['FASTNSQ_TEST_LOOKUPD_HTTP'], '--out', os.path.join(sys.argv[1], folder), "
        "'--server', server, *sys.argv[2:]])"
    )
    out = ROOT / "tests" / "captures"
    run(python, "-m", "fastnsq.testing.real", real_bin, "--nsqds", "1", "--", python, "-c", record, out, *rest)


def bench(python: Path, args: list[str]) -> None:
    run(python, "bench/run_all.py", *args)


DOCS_OUT = ROOT / "docs" / "_build" / "html"


def docs(python: Path, args: list[str]) -> None:
    """Build the documentation site as the tests do (tests/test_docs.py): any warning fails it.

    ``--serve [PORT]`` then serves it on 127.0.0.1 (port 8000 by default) until Ctrl-C.
    """
    rest = list(args)
    serve = "--serve" in rest
    port = "8000"
    if serve:
        at = rest.index("--serve")
        if at + 1 < len(rest) and rest[at + 1].isdigit():
            port = rest.pop(at + 1)
        rest.pop(at)
    run(python, "-m", "sphinx", "-W", "--keep-going", "-E", "-b", "html", *rest, ROOT / "docs", DOCS_OUT)
    print(f"built: {DOCS_OUT / 'index.html'}", flush=True)
    if serve:
        print(f"serving http://127.0.0.1:{port}/ (Ctrl-C stops)", flush=True)
        try:
            run(python, "-m", "http.server", port, "--bind", "127.0.0.1", "--directory", DOCS_OUT)
        except KeyboardInterrupt:
            pass


COMMANDS = {"demo": demo, "test": test, "bench": bench, "captures": captures, "docs": docs}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__)
        return 2
    python = setup()
    try:
        COMMANDS[sys.argv[1]](python, sys.argv[2:])
    except subprocess.CalledProcessError as exc:
        return exc.returncode or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
