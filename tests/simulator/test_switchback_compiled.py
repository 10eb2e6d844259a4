"""The mypyc-compiled cores: cache key, reuse, install guard, fallback, and one real build."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from common import compiled_cores as compiled
from simulator.switchback.experiment import Options, experiment_run

from .switchback_fixtures import files


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """A copy of the core packages' sources, free to edit."""
    root = tmp_path / "src"
    for name in compiled.source_files():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(compiled.SOURCE_ROOT / name, target)
    return root


def fake_build(cache: Path, key: str, modules: dict[str, str]) -> Path:
    """A build directory as ``build`` leaves it (empty stand-ins for the .so files)."""
    path = cache / key
    for relative in modules.values():
        (path / relative).parent.mkdir(parents=True, exist_ok=True)
        (path / relative).write_bytes(b"")
    manifest = {"key": key, "files": modules}
    (path / compiled.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    return path


MODULES = {"routing.core.cost": f"routing/core/cost{compiled.EXT_SUFFIX}"}


def test_it_changes_the_key_when_a_core_source_changes(sources: Path):
    key = compiled.build_key(sources)
    assert compiled.build_key(sources) == key
    cost = sources / "routing" / "core" / "cost.py"
    original = cost.read_bytes()
    cost.write_bytes(original + b"\n")
    assert compiled.build_key(sources) != key
    cost.write_bytes(original)
    assert compiled.build_key(sources) == key
    # specs.py is not compiled, but the compiled modules are typed against it.
    specs = sources / "quotas" / "core" / "specs.py"
    specs.write_bytes(specs.read_bytes().replace(b"RAMP", b"RAMP_", 1))
    assert compiled.build_key(sources) != key


def test_it_lists_what_it_compiles_without_packages_and_specs():
    files = compiled.compiled_files(compiled.source_files())
    assert "routing/core/router.py" in files and "quotas/core/book.py" in files
    assert not any(f.endswith(("__init__.py", "/specs.py")) for f in files)


def test_it_reuses_a_build_only_on_an_exact_key_match(sources: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    key = compiled.build_key(sources)
    fake_build(cache, key, MODULES)
    reused = compiled.build(cache=cache, sources=sources)  # no compiler run: it is cached
    assert reused.path == cache / key and reused.built_s is None
    assert reused.modules == ("routing.core.cost",)
    (sources / "routing" / "core" / "cost.py").write_text("# edited\n", encoding="utf-8")
    assert compiled.cached(compiled.build_key(sources), cache) is None


def test_it_ignores_a_build_directory_that_is_not_complete(tmp_path: Path):
    cache = tmp_path / "cache"
    assert compiled.cached("k1", cache) is None
    fake_build(cache, "k1", MODULES)
    assert compiled.cached("k1", cache) is not None
    # a manifest for another key under this name, or a listed file missing: not reused
    fake_build(cache, "k2", MODULES)
    (cache / "k2" / compiled.MANIFEST).write_text(json.dumps({"key": "k1", "files": MODULES}))
    assert compiled.cached("k2", cache) is None
    (cache / "k1" / MODULES["routing.core.cost"]).unlink()
    assert compiled.cached("k1", cache) is None


def test_it_removes_builds_unused_for_two_weeks_and_keeps_the_one_it_reuses(
    sources: Path, tmp_path: Path
):
    cache = tmp_path / "cache"
    key = compiled.build_key(sources)
    current, stale, recent = (fake_build(cache, k, MODULES) for k in (key, "old", "new"))
    month_ago = time.time() - 30 * 86400
    for build in (current, stale):  # the current one, too, was last used a month ago
        os.utime(build / compiled.MANIFEST, (month_ago, month_ago))
    assert compiled.build(cache=cache, sources=sources).path == current
    assert current.exists() and recent.exists()
    assert not stale.exists()


def test_it_keeps_the_first_of_two_builds_of_one_key(tmp_path: Path):
    cache = tmp_path / "cache"
    first = fake_build(tmp_path / "a", "k", {**MODULES, "x": "first"})
    second = fake_build(tmp_path / "b", "k", {**MODULES, "x": "second"})
    cache.mkdir()
    compiled._publish(first, cache / "k")
    compiled._publish(second, cache / "k")  # lost the race: no error, the winner stays whole
    assert (cache / "k" / "first").exists() and not (cache / "k" / "second").exists()
    assert compiled.cached("k", cache) is not None


def test_it_refuses_to_install_over_cores_already_imported(tmp_path: Path):
    import routing.core.cost  # noqa: F401  (imported as Python here, as Django does)

    path = fake_build(tmp_path, "k", MODULES)
    finders = list(sys.meta_path)
    with pytest.raises(compiled.InstallError, match="already imported"):
        compiled.install(path)
    assert sys.meta_path == finders


def test_it_runs_pure_python_with_one_line_when_the_build_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv(compiled.CACHE_ENV, str(blocker / "cache"))
    config, market = files(tmp_path)
    out, err = StringIO(), StringIO()
    call_command(
        "switchback", "--config", config, "--market", market, "--days", "0.5",
        "--json", str(tmp_path / "result.json"), "--no-progress", stdout=out, stderr=err,
    )  # fmt: skip
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("switchback: cores run as pure Python")
    assert json.loads((tmp_path / "result.json").read_text())["experiment"]["pairs"] == 6


def test_it_builds_for_real_and_the_compiled_cores_give_the_same_result(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
):
    """Compiles for real (about 25 s on 2 cores), then runs a half day both ways."""
    build = compiled.build(cache=tmp_path / "cache")
    assert build.built_s is not None and (build.path / compiled.MANIFEST).is_file()
    assert compiled.build(cache=tmp_path / "cache").built_s is None  # the second time: cached
    with ProcessPoolExecutor(
        1,
        mp_context=mp.get_context("spawn"),
        initializer=compiled.worker_start,
        initargs=(str(build.path), "os:getpid"),
    ) as pool:
        loaded = pool.submit(compiled.compiled_modules).result()
    assert {"routing.core.router", "quotas.core.book", "quotas.core.queuebook"} <= set(loaded)
    config, market = files(tmp_path)
    pure = experiment_run(Options(config, market, days=0.5))
    fast = experiment_run(Options(config, market, days=0.5, compiled=str(build.path)))
    assert json.dumps(fast.result, sort_keys=True) == json.dumps(pure.result, sort_keys=True)
    assert "pure Python" not in capfd.readouterr().err  # no worker fell back
