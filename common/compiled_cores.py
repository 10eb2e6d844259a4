"""The quota and routing cores compiled by mypyc: for the switchback's long runs and for the
gateway's workers.

A simulated week makes hundreds of millions of calls into ``quotas.core`` and ``routing.core``;
compiled by mypyc they run about twice as fast, with the same results. A proxied request spends
about a tenth of the gateway's CPU in them: compiled, the request executes ~4 % fewer
instructions (bench/results/gateway_cpu.md; ``gateway.serve`` loads the build).

``build`` compiles them into a cache outside the source tree (``$SWITCHYARD_BUILD_CACHE``, else
``~/.cache/switchyard/mypyc``), in a directory named by a hash of the exact sources, mypy's
version and the interpreter's ABI, so an edited source can never run as a stale build.
``install`` makes the following imports of those modules load the compiled files. It must run
before anything imports the cores: a process holding a pure class and its compiled twin would
fail ``isinstance`` checks. So this module imports neither core.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

SOURCE_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("quotas/core", "routing/core")
# Packages stay Python (they only re-export). mypyc rejects specs.py (an int assigned to a
# float); it builds bucket specs once per run, off the hot path.
NOT_COMPILED = frozenset({"__init__.py", "specs.py"})
CACHE_ENV = "SWITCHYARD_BUILD_CACHE"
MANIFEST = "manifest.json"
EXT_SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")
BUILD_TIMEOUT_S = 900.0
STALE_S = 86400.0  # a work directory this old belongs to no running build
UNUSED_S = 14 * 86400.0  # a build not used for this long is removed (each is ~3 MB)
LOG_TAIL = 12  # lines of the compiler's output kept in a BuildError

_SETUP = """\
from setuptools import setup
from mypyc.build import mypycify

setup(
    name="switchyard-cores",
    ext_modules=mypycify({files!r}, opt_level="3", debug_level="1"),
    script_args=["build_ext", "--inplace"],
)
"""


class BuildError(Exception):
    """The compiled cores could not be built (no compiler, a mypyc error, a failed check)."""


class InstallError(Exception):
    """A build could not be installed in this process (cores already imported, bad files)."""


@dataclass(frozen=True)
class Build:
    """A usable build: its directory, key and modules; ``built_s`` is None when it was cached."""

    path: Path
    key: str
    modules: tuple[str, ...]
    built_s: float | None


def cache_root() -> Path:
    """Where builds are kept: ``$SWITCHYARD_BUILD_CACHE`` or ``~/.cache/switchyard/mypyc``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "switchyard" / "mypyc"


def source_files(sources: Path = SOURCE_ROOT) -> list[str]:
    """Every Python file of the core packages, relative to ``sources`` (what mypy reads)."""
    found = [
        path.relative_to(sources).as_posix()
        for package in PACKAGES
        for path in (sources / package).rglob("*.py")
    ]
    return sorted(found)


def compiled_files(files: Sequence[str]) -> list[str]:
    """The files mypyc compiles: all but the packages' ``__init__`` and ``NOT_COMPILED``."""
    return [f for f in files if f.rsplit("/", 1)[-1] not in NOT_COMPILED]


def build_key(sources: Path = SOURCE_ROOT) -> str:
    """Hash of the exact sources, the build recipe, mypy's version and the interpreter's ABI."""
    files = source_files(sources)
    digest = hashlib.sha256()
    for part in (
        _SETUP.format(files=compiled_files(files)),
        importlib.metadata.version("mypy"),
        EXT_SUFFIX,
        sys.version,
        sysconfig.get_platform(),
    ):
        digest.update(part.encode() + b"\0")
    for name in files:
        content = (sources / name).read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode() + content)
    return digest.hexdigest()[:32]


def cached(key: str, cache: Path | None = None) -> Build | None:
    """The complete build stored under exactly ``key``, or None."""
    path = (cache or cache_root()) / key
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files: dict[str, str] = manifest.get("files", {})
    if manifest.get("key") != key or not files:
        return None
    if not all((path / f).is_file() for f in files.values()):
        return None
    return Build(path, key, tuple(sorted(files)), None)


def build(*, cache: Path | None = None, sources: Path = SOURCE_ROOT) -> Build:
    """The cached build for the current sources, compiling it first if there is none."""
    root = cache or cache_root()
    key = build_key(sources)
    found = cached(key, root)
    if found is not None:
        _used(found.path)
        _prune(root)
        return found
    started = time.perf_counter()
    try:
        root.mkdir(parents=True, exist_ok=True)
        _prune(root)
        work = Path(tempfile.mkdtemp(prefix=f".build-{key[:8]}-", dir=root))
    except OSError as error:
        raise BuildError(f"cannot create a build directory in {root}: {error}") from None
    try:
        stage = _compile(work, sources, key)
        _check(stage, sources)
        _publish(stage, root / key)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    done = cached(key, root)
    if done is None:
        raise BuildError(f"{root / key}: incomplete after the build")
    return Build(done.path, key, done.modules, time.perf_counter() - started)


def cores(*, pure: bool) -> tuple[str | None, str]:
    """The build to run on (None: pure Python) and a line saying which cores run and why."""
    if pure:
        return None, "cores run as pure Python (--pure)"
    try:
        found = build()
    except BuildError as error:
        return None, f"cores run as pure Python: the mypyc build failed: {error}"
    how = "cached" if found.built_s is None else f"built in {found.built_s:.1f} s"
    return str(found.path), f"cores compiled by mypyc ({how}: {found.path})"


def install(path: str | Path) -> tuple[str, ...]:
    """Load the build at ``path`` for the compiled modules; raise if any is already imported.

    On failure nothing of the cores stays imported, so the caller may go on in pure Python.
    """
    root = Path(path)
    try:
        files: dict[str, str] = json.loads((root / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError) as error:
        raise InstallError(f"{root}: no usable {MANIFEST} ({error})") from None
    early = sorted(name for name in files if name in sys.modules)
    if early:
        raise InstallError(f"already imported as Python: {', '.join(early)}")
    before = set(sys.modules)
    finder = _Finder(root, files)
    sys.meta_path.insert(0, finder)
    try:
        for name in sorted(files):
            importlib.import_module(name)
        stray = sorted(n for n in files if not _from_build(sys.modules[n], root))
        if stray:
            raise InstallError(f"not loaded from {root}: {', '.join(stray)}")
    except Exception as error:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            del sys.modules[name]
        if isinstance(error, InstallError):
            raise
        raise InstallError(f"{root}: {type(error).__name__}: {error}") from None
    return tuple(sorted(files))


def compiled_modules() -> list[str]:
    """The core modules this process runs compiled (for checks and messages)."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith(("quotas.core.", "routing.core."))
        and str(getattr(module, "__file__", "") or "").endswith(EXT_SUFFIX)
    )


def worker_start(path: str | None, then: str, *args: object) -> None:
    """Process-pool initializer: install the build at ``path`` (if any), then call ``then``.

    ``then`` ("module:function") is named, not pickled: unpickling a function imports its
    module, and that would import the cores before the build is installed.
    """
    if path is not None:
        try:
            install(path)
        except InstallError as error:
            print(f"switchback: worker {os.getpid()}: {error}; pure Python", file=sys.stderr)
    module, _, name = then.partition(":")
    getattr(importlib.import_module(module), name)(*args)


class _Finder(MetaPathFinder):
    """Finds the build's extension modules ahead of the source tree; nothing else."""

    def __init__(self, root: Path, files: dict[str, str]) -> None:
        self.root, self.files = root, files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        relative = self.files.get(fullname)
        if relative is None:
            return None
        location = str(self.root / relative)
        loader = importlib.machinery.ExtensionFileLoader(fullname, location)
        return importlib.util.spec_from_file_location(fullname, location, loader=loader)


def _from_build(module: ModuleType, root: Path) -> bool:
    location = str(getattr(module, "__file__", "") or "")
    return location.endswith(EXT_SUFFIX) and Path(location).parent.is_relative_to(root)


def _compile(work: Path, sources: Path, key: str) -> Path:
    """Compile a copy of the sources in ``work``; return a directory of just the results."""
    files = source_files(sources)
    for name in files:
        target = work / "src" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sources / name, target)
    for package in {name.split("/", 1)[0] for name in files}:
        (work / "src" / package / "__init__.py").touch()  # the top packages, not their contents
    (work / "src" / "setup.py").write_text(_SETUP.format(files=compiled_files(files)))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # mypy must type-check the copy, not the checkout
    _run([sys.executable, "setup.py"], cwd=work / "src", env=env, what="mypyc")
    stage = work / "out"
    built: dict[str, str] = {}
    for result in sorted((work / "src").glob(f"**/*{EXT_SUFFIX}")):
        relative = result.relative_to(work / "src")
        if relative.parts[0] == "build":
            continue  # setuptools' intermediate copy
        (stage / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(result, stage / relative)
        built[relative.as_posix()[: -len(EXT_SUFFIX)].replace("/", ".")] = relative.as_posix()
    expected = {f[: -len(".py")].replace("/", ".") for f in compiled_files(files)}
    if not expected <= set(built):
        raise BuildError(f"mypyc built no module for {', '.join(sorted(expected - set(built)))}")
    manifest = {"key": key, "files": built, "mypy": importlib.metadata.version("mypy")}
    (stage / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return stage


def _check(stage: Path, sources: Path) -> None:
    """Install the build in a fresh interpreter: only a build that loads enters the cache."""
    path = os.pathsep.join(dict.fromkeys([str(sources), str(SOURCE_ROOT)]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
    code = "import sys; from common.compiled_cores import install; install(sys.argv[1])"
    _run([sys.executable, "-c", code, str(stage)], cwd=sources, env=env, what="the check")


def _publish(stage: Path, final: Path) -> None:
    """Rename the finished build into place; a concurrent build that got there first wins."""
    try:
        os.rename(stage, final)
    except OSError:
        if cached(final.name, final.parent) is not None:
            return  # the same key built by another process: identical, keep theirs
        # A leftover that is not a complete build (not ours to trust): move it aside, retry.
        aside = Path(tempfile.mkdtemp(prefix=".stale-", dir=final.parent))
        try:
            os.rename(final, aside / "old")
            os.rename(stage, final)
        except OSError as error:
            raise BuildError(f"cannot move the build into {final}: {error}") from None
        finally:
            shutil.rmtree(aside, ignore_errors=True)


def _used(path: Path) -> None:
    """Mark a build as used now (its manifest's time), so pruning keeps it."""
    with contextlib.suppress(OSError):
        os.utime(path / MANIFEST)


def _prune(root: Path) -> None:
    """Remove work directories that builds killed long ago left behind, and unused builds.

    Every edit of the cores makes a new build; those not used for ``UNUSED_S`` go.
    """
    now = time.time()
    for leftover in root.glob(".build-*"):
        try:
            old = now - leftover.stat().st_mtime > STALE_S
        except OSError:
            continue
        if old:
            shutil.rmtree(leftover, ignore_errors=True)
    for manifest in root.glob(f"*/{MANIFEST}"):
        try:
            unused = now - manifest.stat().st_mtime > UNUSED_S
        except OSError:
            continue
        if unused:
            shutil.rmtree(manifest.parent, ignore_errors=True)


def _run(command: list[str], *, cwd: Path, env: dict[str, str], what: str) -> None:
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"{what} did not run: {error}") from None
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        tail = " | ".join(lines[-LOG_TAIL:])
        raise BuildError(f"{what} failed (exit {done.returncode}): {tail}")


__all__ = [
    "Build",
    "BuildError",
    "InstallError",
    "build",
    "build_key",
    "cache_root",
    "cached",
    "compiled_modules",
    "cores",
    "install",
    "source_files",
    "worker_start",
]


def main() -> None:
    """``python -m common.compiled_cores``: make the build for these sources, unless it exists
    (the gateway's workers load it: ``gateway.serve``)."""
    path, which = cores(pure=False)
    print(which)
    sys.exit(0 if path else 1)


if __name__ == "__main__":
    main()
