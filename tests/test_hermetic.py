"""A bare clone runs every test: nothing a test, benchmark or the simulator reads may live
outside the checkout, and every recorded fixture names its source and licence.

Static by design (it reads the tracked files, it does not run them): a path outside the
checkout is a string in some source file, and a string is cheap to find. Prose (Markdown)
may mention other places; code, scripts, playbooks and settings may not."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Places outside the checkout that have been used as fixture roots beside it (spelled in
# pieces, so that this file does not name them itself).
_OUTSIDE = "sha" + "red"
FORBIDDEN = ("../" + _OUTSIDE, _OUTSIDE + "/fixtures", "/work/" + _OUTSIDE)
CODE_SUFFIXES = {".rs", ".py", ".sh", ".js", ".toml", ".yaml", ".yml", ".json", ".ini", ".cfg",
                 ".txt", ""}


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_no_code_reads_outside_the_checkout():
    me = Path(__file__).resolve()
    offenders = []
    for path in tracked_files():
        if path == me or path.suffix not in CODE_SUFFIXES:
            continue
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("fixtures", "vendor") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if any(f in line for f in FORBIDDEN):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "reads outside the checkout:\n" + "\n".join(offenders)


def test_every_fixture_directory_names_its_source_and_licence():
    fixtures = ROOT / "fixtures"
    assert (fixtures / "README.md").is_file()
    dirs = sorted(p for p in fixtures.iterdir() if p.is_dir())
    assert {d.name for d in dirs} >= {"redfish", "sysfs", "smartctl", "kiln"}
    for d in dirs:
        if d.name == "kiln":
            # This project's own recordings: the README says how each was made.
            assert (d / "README.md").is_file(), d
            continue
        assert (d / "SOURCE").is_file(), f"{d} has no SOURCE"
        assert any(p.name.startswith("LICENSE") for p in d.iterdir()), f"{d} has no LICENSE"
        source = (d / "SOURCE").read_text()
        for entry in d.iterdir():
            if entry.name in ("SOURCE",) or entry.name.startswith("LICENSE"):
                continue
            stem = entry.name.split(".")[0] if entry.is_file() else entry.name
            assert stem in source, f"{entry} is not listed in {d / 'SOURCE'}"
