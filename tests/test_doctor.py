"""``stoker doctor`` in a fresh interpreter: its sections, its exit status, and the advice it
gives when a fast path is off (the extension made unimportable, as on a machine where it
could not be built or its libjpeg is missing); ``stoker demo`` pointing to it then."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from stoker._doctor import turbo_version

SECTIONS = ("System", "Fast paths", "Libraries", "CPUs", "Memory", "Shared memory", "What to do")

# Run before the command: make stoker's extension fail to import as a missing shared
# library would (the finder sits first, so the real file is never reached).
BLOCK_NATIVE = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "stoker.vision._native":
            raise ImportError("libjpeg.so.62: cannot open shared object file")
        return None
sys.meta_path.insert(0, _Block())
"""


def _stoker(*argv: str, before: str = "", after: str = "") -> subprocess.CompletedProcess[str]:
    """``stoker ARGV`` in a new interpreter, with code run before and after ``main``."""
    code = textwrap.dedent(
        f"""
        {textwrap.indent(textwrap.dedent(before), "        ").strip()}
        import sys
        from stoker._cli import main
        status = main({list(argv)!r})
        {after.strip()}
        sys.exit(status)
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_doctor_prints_every_section_and_exits_0_without_importing_torch() -> None:
    done = _stoker("doctor", after='print("TORCH IMPORTED:", "torch" in sys.modules)')
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for title in SECTIONS:
        assert title in lines, (title, done.stdout)
    for label in ("native kernels", "torch", "simplejpeg", "Pillow", "usable", "cgroup quota"):
        assert any(line.strip().startswith(label) for line in lines), label
    assert "/dev/shm free" in done.stdout and "start method" in done.stdout
    assert "TORCH IMPORTED: False" in lines


def test_doctor_json_has_the_same_sections() -> None:
    done = _stoker("doctor", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert list(report["sections"]) == list(SECTIONS[:-1])
    assert "usable" in report["sections"]["CPUs"]
    assert isinstance(report["advice"], list)


def test_doctor_shows_why_the_extension_is_off_and_what_to_do() -> None:
    done = _stoker("doctor", before=BLOCK_NATIVE)
    assert done.returncode == 0, done.stderr
    native = next(line for line in done.stdout.splitlines() if "native kernels" in line)
    assert "not available" in native and "libjpeg.so.62" in native
    advice = done.stdout.split("\nWhat to do\n", 1)[1]
    assert "apt-get install" in advice and "libjpeg-dev" in advice and "reinstall" in advice
    assert "nothing: every fast path is on" not in advice


def test_demo_points_to_doctor_when_a_fast_path_is_off() -> None:
    # Pillow hidden too, so the demo skips its image part and stays short.
    done = _stoker(
        "demo",
        "--samples",
        "2000",
        "--epochs",
        "1",
        before=BLOCK_NATIVE + 'sys.modules["PIL"] = None\n',
    )
    assert done.returncode == 0, done.stderr
    assert "`stoker doctor`" in done.stdout.splitlines()[-1]


@pytest.mark.parametrize(("number", "text"), [(2001005, "2.1.5"), (3001000, "3.1.0")])
def test_turbo_version(number: int, text: str) -> None:
    assert turbo_version(number) == text
