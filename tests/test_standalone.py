"""The project stands alone: a clone with nothing beside it has everything its tests read.

Nothing under the checked folders reads or names a path outside the checkout (a folder
beside it, ``Path(__file__).parents[N]`` above the root), except where a user passes one
in (``--real BIN_DIR``); and the tree holds no other project's wheels, archives or
binaries (those come from package registries, or are built outside the checkout).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What a user of the repository runs or reads: these must not lean on anything beside it.
CHECKED = ("fastnsq", "tests", "bench", "docs", ".ci", "dev.py", "README.md", "pyproject.toml", "setup.py")
#: A folder beside the checkout, by the names it has had (the steering repository's notes).
BESIDE = re.compile(r"\.\./shared\b|\bshared/(?:protocol|design|captures|real-servers|youzan-parity|peers|style)\b")
#: ``Path(__file__)`` climbed by ``parents[N]`` and ``.parent`` steps.
CLIMB = re.compile(r"__file__\)(?:\.resolve\(\))?((?:\.parents\[\d+\]|\.parent\b)+)")
ARCHIVES = (".whl", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip", ".jar", ".egg", ".rpm", ".deb")
#: Compiled code: ELF (Linux), Mach-O (both byte orders, fat), PE (Windows).
BINARY_MAGIC = (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xca\xfe\xba\xbe", b"MZ")
TEXT_SUFFIXES = {".py", ".pyx", ".pxd", ".pyi", ".md", ".txt", ".toml", ".cfg", ".ini", ".sh", ".go", ".json", ".yml",
                 ".yaml", ".rst", ".html", ".js", ".css", ""}


def tracked_files(root: Path) -> list[str]:
    """The files git tracks under ``root`` (what a clone gets), else every file there."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], check=False, capture_output=True)
    if listed.returncode == 0 and listed.stdout:
        return [name for name in listed.stdout.decode().split("\0") if name]
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".git" not in p.parts]


def _checked(name: str) -> bool:
    return name.split("/", 1)[0] in CHECKED


def _climbs_above_root(name: str, text: str) -> Iterator[str]:
    """``Path(__file__)`` climbs that leave the checkout, for a file at ``name``."""
    depth = name.count("/")  # tests/x.py: parents[0] is tests, parents[1] the root
    for match in CLIMB.finditer(text):
        steps = 0
        for part in re.findall(r"parents\[(\d+)\]|parent\b", match.group(1)):
            steps += int(part) + 1 if part else 1
        if steps > depth + 1:
            yield match.group(0)


def outside_references(root: Path, names: Iterable[str]) -> list[str]:
    """``file:line: text`` for each line that names or climbs to a path outside the checkout."""
    found = []
    for name in names:
        path = root / name
        if not _checked(name) or "".join(path.suffixes[-1:]) not in TEXT_SUFFIXES or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if BESIDE.search(line) or any(_climbs_above_root(name, line)):
                found.append(f"{name}:{number}: {line.strip()[:160]}")
    return found


def foreign_artifacts(root: Path, names: Iterable[str]) -> list[str]:
    """Committed archives and compiled binaries: another project's build output, never ours to ship."""
    found = []
    for name in names:
        path = root / name
        if name.endswith(ARCHIVES):
            found.append(f"{name}: an archive")
            continue
        if path.is_file():
            with open(path, "rb") as f:
                head = f.read(4)
            if any(head.startswith(magic) for magic in BINARY_MAGIC) and not name.endswith((".png", ".txt")):
                found.append(f"{name}: a compiled binary")
    return found


def test_nothing_names_a_path_outside_the_checkout() -> None:
    assert outside_references(ROOT, tracked_files(ROOT)) == []


def test_no_wheel_archive_or_binary_is_committed() -> None:
    assert foreign_artifacts(ROOT, tracked_files(ROOT)) == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """Planted faults in a scratch tree are found: the two checks above can fail."""
    (tmp_path / "tests" / "deep").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    # Spelled apart, or the checks would find them in this very file.
    beside, here = "../" + "shared", "Path(__" + "file__)"
    planted = {
        "tests/beside.py": f'CAPTURES = ROOT / "{beside}/captures"\n',
        "tests/climb.py": f'DATA = {here}.resolve().parents[1].parent / "data"\n',
        "tests/deep/climb.py": f"DATA = {here}.parents[3]\n",
        "docs/page.md": f"Build them with {beside[3:]}/real-servers/build-nsq.sh.\n",
        "tests/inside.py": f"ROOT = {here}.resolve().parents[1]\nHERE = {here}.parent\n",
        "tests/deep/inside.py": f"ROOT = {here}.parents[2]\n",
        "prometheus_client-0.26.0-py3-none-any.whl": "PK",
        "tests/nsqd": "\x7fELF\x02\x01\x01",
    }
    for name, text in planted.items():
        (tmp_path / name).write_text(text)
    names = sorted(planted)
    outside = {line.split(":", 1)[0] for line in outside_references(tmp_path, names)}
    assert outside == {"tests/beside.py", "tests/climb.py", "tests/deep/climb.py", "docs/page.md"}
    assert foreign_artifacts(tmp_path, names) == [
        "prometheus_client-0.26.0-py3-none-any.whl: an archive", "tests/nsqd: a compiled binary"]
