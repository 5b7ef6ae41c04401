"""The drop-in package (python/compat, distribution tide-mooncake-compat) as a
user installs it: a venv with Debian's site packages, the tide wheel and the
compat package installed offline, then Mooncake's import line and a transfer
over TCP; and its refusal to stand in for a real Mooncake.  Needs the package's
source (TIDE_TEST_COMPAT_DIR) and the wheel tools/python-wheel built
(TIDE_TEST_WHEEL_DIR), or, without a wheel, a venv with tide installed running
the suite (tools/python-wheel with TIDE_PY_VENV): the package then goes into a
copy of that venv.  tools/python-wheel sets them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WHEELS = os.environ.get("TIDE_TEST_WHEEL_DIR", "")
COMPAT = os.environ.get("TIDE_TEST_COMPAT_DIR", "")
IN_VENV = sys.prefix != sys.base_prefix
pytestmark = pytest.mark.skipif(not ((WHEELS or IN_VENV) and COMPAT and Path(COMPAT, "pyproject.toml").is_file()),
                                reason="needs TIDE_TEST_COMPAT_DIR, and TIDE_TEST_WHEEL_DIR or a venv "
                                       "(tools/python-wheel test)")

TRANSFER = r"""
import numpy as np
from mooncake.engine import TransferEngine, TransferOpcode
import mooncake.engine, tide
assert TransferEngine is tide.TransferEngine and TransferOpcode is tide.TransferOpcode
a, b = TransferEngine(), TransferEngine()
assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
src = np.frombuffer(bytes(range(256)) * 256, np.uint8).copy()
dst = np.zeros(src.nbytes, np.uint8)
assert a.register_memory(src.ctypes.data, src.nbytes) == 0
assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
peer = f"127.0.0.1:{b.get_rpc_port()}"
assert a.transfer_sync(peer, src.ctypes.data, dst.ctypes.data, src.nbytes, TransferOpcode.Write) == 0
assert dst.tobytes() == src.tobytes()
back = np.zeros(src.nbytes, np.uint8)
assert a.register_memory(back.ctypes.data, back.nbytes) == 0
assert a.transfer_sync_read(peer, back.ctypes.data, dst.ctypes.data, src.nbytes) == 0
assert back.tobytes() == src.tobytes()
a.close(); b.close()
print("moved", src.nbytes, "bytes through", mooncake.engine.__name__)
"""


def _run(venv: Path, code: str, env=None, cwd="/"):
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat")
    venv = root / "venv"
    compat = root / "compat"
    shutil.copytree(COMPAT, compat, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    if WHEELS:
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        wheels = sorted(Path(WHEELS).glob("tide_transfer_engine-*.whl"))
        assert wheels, f"no tide_transfer_engine wheel in {WHEELS}"
        packages = [str(wheels[-1]), str(compat)]
    else:
        # The running venv has tide as its user installed it; the tests below add files to
        # their venv's site-packages, so they get a copy (bin/python stays a link to the base).
        shutil.copytree(sys.prefix, venv, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        packages = ["--force-reinstall", "--no-deps", str(compat)]
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-index", *packages], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return venv


def test_from_mooncake_engine_import_transfer_engine_moves_bytes_over_tcp(venv):
    r = _run(venv, TRANSFER)
    assert r.returncode == 0, r.stderr
    assert "moved 65536 bytes through mooncake.engine" in r.stdout


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def test_refuses_to_shadow_an_installed_mooncake(venv):
    # A distribution named like Mooncake's wheel, owning files under mooncake/.
    info = _site_packages(venv) / "mooncake_transfer_engine-0.3.7.dist-info"
    info.mkdir()
    try:
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mooncake-transfer-engine\nVersion: 0.3.7\n")
        (info / "RECORD").write_text("mooncake/engine.cpython-311-x86_64-linux-gnu.so,,\n")
        r = _run(venv, "import mooncake.engine")
        assert r.returncode != 0
        assert "ImportError: tide-mooncake-compat refuses to stand in for Mooncake" in r.stderr
        assert "distribution mooncake-transfer-engine 0.3.7" in r.stderr and "TIDE_MOONCAKE_COMPAT=force" in r.stderr
        # The override, explicit: tide's module, with a warning on the "tide" logger.
        r = _run(venv, TRANSFER, env={"TIDE_MOONCAKE_COMPAT": "force"})
        assert r.returncode == 0, r.stderr
        assert "TIDE_MOONCAKE_COMPAT=force" in r.stderr
    finally:
        shutil.rmtree(info)
    assert _run(venv, "import mooncake.engine").returncode == 0


def test_refuses_a_mooncake_package_later_on_sys_path(venv, tmp_path):
    other = tmp_path / "src"
    (other / "mooncake").mkdir(parents=True)
    (other / "mooncake" / "__init__.py").write_text("")
    r = _run(venv, f"import sys; sys.path.append({str(other)!r}); import mooncake")
    assert r.returncode != 0
    assert f"package {other / 'mooncake'}" in r.stderr


IMPORT_LINE = "from mooncake.engine import TransferEngine; print(TransferEngine.__module__)"


def test_a_copy_of_the_drop_in_in_the_working_directory_is_no_conflict(venv, tmp_path):
    # `python -c` puts the working directory first on sys.path: in the package's source directory
    # (python/compat) its source copy is the `mooncake` imported and the installed copy is seen
    # beside it; in a setuptools build/lib copy the same. Both are this drop-in, not a Mooncake.
    source = venv.parent / "compat"  # the copy the fixture installed from
    build_lib = tmp_path / "build" / "lib"
    shutil.copytree(source / "mooncake", build_lib / "mooncake")
    for cwd in (source, build_lib, venv.parent, "/"):
        r = _run(venv, IMPORT_LINE, cwd=str(cwd))
        assert r.returncode == 0, f"cwd {cwd}: {r.stderr}"
        assert r.stdout.strip() == "tide._mooncake", f"cwd {cwd}: {r.stdout}"
    # The source copy imported, the installed one beside it: still the same TransferEngine.
    r = _run(venv, "import mooncake, tide; print(mooncake.__file__)\nfrom mooncake.engine import TransferEngine\n"
                   "assert TransferEngine is tide.TransferEngine", cwd=str(source))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(source / "mooncake" / "__init__.py")


def test_a_different_mooncake_beside_it_still_refuses(venv, tmp_path):
    # A mooncake package later on sys.path that is not this drop-in (its __init__ lacks the
    # drop-in's marker line): refused, as before the copies were told apart.
    other = tmp_path / "mooncake"
    other.mkdir()
    (other / "__init__.py").write_text('"""Mooncake."""\n')
    r = _run(venv, f"import sys; sys.path.append({str(tmp_path)!r}); import mooncake.engine")
    assert r.returncode != 0 and "refuses to stand in for Mooncake" in r.stderr, r.stderr
    assert f"package {other}" in r.stderr
    # One that merely mentions the distribution's name is not a copy either.
    (other / "__init__.py").write_text("# not tide-mooncake-compat\n")
    r = _run(venv, f"import sys; sys.path.append({str(tmp_path)!r}); import mooncake.engine")
    assert r.returncode != 0 and f"package {other}" in r.stderr, r.stderr


def test_importing_from_the_source_tree_says_so(venv, tmp_path):
    # From python/ the source tree's `tide` (no compiled _tide) shadows the installed module: the
    # error says what happened and what to do, for `import tide` and for the drop-in's import line.
    src = Path(COMPAT).resolve().parent / "tide"
    if not (src / "__init__.py").is_file():
        pytest.skip(f"no tide source tree beside {COMPAT}")
    tree = tmp_path / "python"
    shutil.copytree(src, tree / "tide", ignore=shutil.ignore_patterns("_tide*.so", "__pycache__"))
    for code in ("import tide", IMPORT_LINE):
        r = _run(venv, code, cwd=str(tree))
        assert r.returncode != 0, f"{code}: {r.stdout}"
        assert "ImportError: this `tide` is tide's source tree" in r.stderr, r.stderr
        assert "install the module" in r.stderr and "outside python/" in r.stderr
        assert "partially initialized" not in r.stderr.splitlines()[-1]
