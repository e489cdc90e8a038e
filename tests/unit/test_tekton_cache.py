"""Step caching on Tekton: results memoized on a claim by the step's script, run twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from couler import ir
from couler.compilers import tekton
from couler.engines.base import Feature
from couler.errors import UnsupportedFeatureError
from tests.conformance.expected import EXPECTED
from tests.conformance.loader import load_program, program_paths
from tests.unit.tekton_sim import run_pipeline
from tests.unit.test_tekton_compiler import compile_ok, ctr, tasks, wf_of

ROOT = Path(__file__).resolve().parents[2]
S = ir.Step
OUT = ir.OutputParameter("n", ir.OutputSource.STDOUT)


def _counting(shared: Path) -> str:
    """A command that counts its runs in ``shared`` and prints the count."""
    count = shared / "runs"
    return (f"c=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $c > {count}; "
            "echo run-$c")


def test_resources_cache_program_binds_the_named_claim(tmp_path: Path) -> None:
    (path,) = [p for p in program_paths() if p.stem == "resources_cache"]
    docs = compile_ok(load_program(path))
    binding = {w["name"]: w for w in docs[1]["spec"]["workspaces"]}
    assert binding["couler-cache-compute-cache"]["persistentVolumeClaim"] == {
        "claimName": "compute-cache"}
    first = run_pipeline(docs, tmp_path / "a", claims=tmp_path / "claims")
    second = run_pipeline(docs, tmp_path / "b", claims=tmp_path / "claims")
    want = EXPECTED["resources_cache"]["steps"]["compute"]["outputs"]["computed"]
    for run, cached in ((first, ""), (second, "true")):
        results = run.tasks["compute"].results
        assert (results["computed"].rstrip("\n"), results["couler-cached"]) == (want, cached)


def test_a_second_run_reuses_the_results_without_running(tmp_path: Path) -> None:
    step = S("count", ctr("sh", "-c", _counting(tmp_path)), outputs=(OUT,),
             cache=ir.CachePolicy())
    docs = compile_ok(wf_of(step))
    runs = [run_pipeline(docs, tmp_path / f"r{i}", shared=tmp_path, claims=tmp_path / "c")
            for i in range(2)]
    assert [r.tasks["count"].results["n"] for r in runs] == ["run-1", "run-1"]
    assert (tmp_path / "runs").read_text().strip() == "1"  # the command ran once


def test_other_input_values_are_other_entries(tmp_path: Path) -> None:
    def wf(value: str) -> ir.Workflow:
        return wf_of(S("count", ctr("sh", "-c", _counting(tmp_path) + " {{inputs.v}}"),
                       inputs=(ir.InputParameter("v", ir.Literal.of(value)),),
                       outputs=(OUT,), cache=ir.CachePolicy()))
    outs = [run_pipeline(compile_ok(wf(v)), tmp_path / f"r{i}", shared=tmp_path,
                         claims=tmp_path / "c").tasks["count"].results["n"]
            for i, v in enumerate(("a", "b", "a"))]
    assert outs == ["run-1 a", "run-2 b", "run-1 a"]


def test_a_failure_is_not_stored(tmp_path: Path) -> None:
    step = S("count", ctr("sh", "-c", _counting(tmp_path) + "; exit 1"), outputs=(OUT,),
             cache=ir.CachePolicy())
    docs = compile_ok(wf_of(step))
    for i in range(2):
        assert run_pipeline(docs, tmp_path / f"r{i}", shared=tmp_path,
                            claims=tmp_path / "c").status == "Failed"
    assert (tmp_path / "runs").read_text().strip() == "2"
    assert not any((tmp_path / "c").rglob("created"))


def test_an_entry_older_than_max_age_runs_again(tmp_path: Path) -> None:
    step = S("count", ctr("sh", "-c", _counting(tmp_path)), outputs=(OUT,),
             cache=ir.CachePolicy(max_age_seconds=3600))
    docs = compile_ok(wf_of(step))
    run_pipeline(docs, tmp_path / "r0", shared=tmp_path, claims=tmp_path / "c")
    (created,) = (tmp_path / "c").rglob("created")
    created.write_text("0\n")  # stored in 1970: older than an hour
    again = run_pipeline(docs, tmp_path / "r1", shared=tmp_path, claims=tmp_path / "c")
    assert again.tasks["count"].results == {"n": "run-2", "couler-cached": ""}
    assert int(created.read_text()) > 0  # replaced by the new entry


def test_a_cached_step_with_output_artifacts_is_refused() -> None:
    step = S("s", ctr("true"), cache=ir.CachePolicy(),
             output_artifacts=(ir.OutputArtifact("a", "/tmp/a"),))
    with pytest.raises(UnsupportedFeatureError) as err:
        tekton.compile_workflow(wf_of(step))
    assert err.value.feature == Feature.CACHE.value


def test_a_disabled_cache_changes_nothing() -> None:
    docs = compile_ok(wf_of(S("s", ctr("true"), cache=ir.CachePolicy(enabled=False))))
    assert "workspaces" not in docs[1]["spec"] and "script" not in tasks(docs)["s"][
        "taskSpec"]["steps"][0]


def test_a_cache_hit_in_the_step_status_rewrite_is_a_success(tmp_path: Path) -> None:
    F = ir.EdgeCondition
    wf = wf_of(S("count", ctr("sh", "-c", _counting(tmp_path)), outputs=(OUT,),
                 cache=ir.CachePolicy()),
               S("always", ctr("true"), dependencies=(ir.Dependency("count", F.ANY),)))
    docs = compile_ok(wf)
    runs = [run_pipeline(docs, tmp_path / f"r{i}", shared=tmp_path, claims=tmp_path / "c")
            for i in range(2)]
    second = runs[1].tasks["count"].results
    assert (second["couler-status"], second["couler-cached"], second["n"]) == (
        "Succeeded", "true", "run-1")
    assert runs[1].status == "Succeeded"
