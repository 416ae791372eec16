"""A shared native-kernel cache (`SPTLIB_KERNEL_CACHE`) someone else can write to: a planted
shared library must never be loaded (its constructor would run with the user's rights).

Real libraries: the "planted" one is compiled here from C with a constructor that writes a file;
the kernels themselves are replaced by a stub built by a fake compiler (`$CXX`), so the test
checks the cache's rules (verify before load, rebuild what fails, refuse unsafe folders) in
seconds, not the kernels (tests/test_native_*.py do).
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from sptlib.kernels.platform.cpu import build

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from test_faults import record  # noqa: E402

PLANTED_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
  FILE *f = fopen(getenv("PLANTED_RAN"), "w");
  if (f) { fputs("the planted library ran\n", f); fclose(f); }
}
"""
STUB_C = "\n".join(f"void *{symbol}(void) {{ return 0; }}" for symbol in build.TARGETS.values())
FAKE_CXX = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fakecxx 1.0"; exit 0; fi
out=""; prev=""
for a in "$@"; do if [ "$prev" = "-o" ]; then out="$a"; fi; prev="$a"; done
echo built >> "$COMPILES"
exec gcc -shared -fPIC -o "$out" "$STUB_C"
"""
PROBE = "from sptlib.kernels.platform.cpu import build; print(build.available())"


@pytest.fixture
def cache(tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("no gcc to build the planted library")
    (tmp_path / "stub.c").write_text(STUB_C)
    (tmp_path / "planted.c").write_text(PLANTED_C)
    cxx = tmp_path / "fakecxx"
    cxx.write_text(FAKE_CXX)
    cxx.chmod(0o755)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "planted.so"),
                    str(tmp_path / "planted.c")], check=True)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, CXX=str(cxx), SPTLIB_KERNEL_CACHE=str(shared), HOME=str(home),
               STUB_C=str(tmp_path / "stub.c"), COMPILES=str(tmp_path / "compiles"),
               PLANTED_RAN=str(tmp_path / "planted_ran"), JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT), SPTLIB_NATIVE="1")
    return tmp_path, env


def _probe(env):
    p = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1] == "True", p.stderr


def _library(folder):
    (lib,) = pathlib.Path(folder).glob("sptlib_kernels-*.so")
    return lib


def _compiles(tmp):
    f = tmp / "compiles"
    return len(f.read_text().split()) if f.exists() else 0


def test_planted_library_in_the_cache_never_runs(cache):
    tmp, env = cache
    ok, _ = _probe(env)  # builds (the stub) and records its digest
    lib = _library(tmp / "shared")
    assert ok and _compiles(tmp) == 1
    ok, _ = _probe(env)  # loaded from the cache, not built again
    assert ok and _compiles(tmp) == 1
    # Someone replaces the library (its digest file left as it was).
    shutil.copy(tmp / "planted.so", lib)
    ok, err = _probe(env)
    assert not (tmp / "planted_ran").exists(), "the planted library's constructor ran"
    assert ok and _compiles(tmp) == 2, err[-2000:]
    assert "its SHA-256 differs from the one recorded when it was built" in err
    assert (lib.parent / (lib.name + ".sha256")).is_file()
    assert oct(lib.stat().st_mode & 0o777) == oct(0o700)
    # ... and with no digest file at all.
    shutil.copy(tmp / "planted.so", lib)
    (lib.parent / (lib.name + ".sha256")).unlink()
    ok, err = _probe(env)
    assert not (tmp / "planted_ran").exists()
    assert ok and _compiles(tmp) == 3 and "no build-time digest beside it" in err
    record("hostile", "a shared library planted in SPTLIB_KERNEL_CACHE under the expected name",
           "HELD: not loaded (SHA-256 differs from the build-time digest, or none), built "
           "again; its constructor never ran")


def test_cache_folder_others_can_write_is_not_used(cache):
    tmp, env = cache
    shared = tmp / "shared"
    ok, _ = _probe(env)
    lib = _library(shared)
    assert ok
    # Anyone may write there now: they could replace both the library and its digest file.
    shutil.copy(tmp / "planted.so", lib)
    import hashlib
    (shared / (lib.name + ".sha256")).write_text(
        hashlib.sha256((tmp / "planted.so").read_bytes()).hexdigest() + "\n")
    shared.chmod(0o777)
    ok, err = _probe(env)
    assert not (tmp / "planted_ran").exists(), "the planted library's constructor ran"
    assert ok and _library(tmp / "home" / ".cache" / "sptlib" / "kernels")
    assert "not using the native-kernel cache" in err and "writable by group or others" in err
    assert err.count("not using the native-kernel cache") == 1
    record("hostile", "SPTLIB_KERNEL_CACHE writable by others, holding a planted library with a "
           "matching digest file", "HELD: the folder is not used (one warning), the library is "
           "built privately in ~/.cache/sptlib/kernels; the planted one never ran")


def test_cache_of_another_user_and_no_private_fallback_disables_native(cache):
    tmp, env = cache
    os.chown(tmp / "shared", 4242, 4242)
    if os.stat(tmp / "shared").st_uid == os.geteuid():
        pytest.skip("cannot give a folder to another uid here")
    (tmp / "home" / ".cache" / "sptlib" / "kernels").mkdir(parents=True, mode=0o777)
    (tmp / "home" / ".cache" / "sptlib" / "kernels").chmod(0o777)
    ok, err = _probe(env)
    assert not ok and _compiles(tmp) == 0
    assert "native CPU kernels unavailable" in err and "is unsafe" in err
