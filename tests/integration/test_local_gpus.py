"""GPUs on the local engine: whole devices handed out, held by one step at a time.

The devices are declared (``LocalEngine(gpus=...)``, as an operator does with
``COULER_LOCAL_GPUS`` or Ray with ``--num-gpus``): this machine has no GPU, and what is
tested is the engine's scheduling -- which devices a step sees, that no two steps hold one
device at once, that a request above the machine's count is refused before anything runs.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from couler import ir
from couler.engines.base import Feature, RunState, StepState, StepStatus, Support
from couler.errors import InsufficientResourcesError
from couler_runtime.local import CAPABILITIES, LocalEngine
from couler_runtime.local import gpus as local_gpus
from tests.conformance.loader import load_program

PY = sys.executable
PROGRAMS = Path(__file__).resolve().parents[1] / "conformance" / "programs"

# argv: DIR NAME PEER... Takes a lock file per device it sees (O_EXCL: fails if another
# step holds it), waits until every PEER holds its devices too, gives them back, prints them.
HOLD = r'''
import os, sys, time
where, me, peers = sys.argv[1], sys.argv[2], sys.argv[3:]
ids = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
for i in ids:
    os.close(os.open(os.path.join(where, "dev-" + i), os.O_CREAT | os.O_EXCL))
open(os.path.join(where, "holding-" + me), "w").close()
deadline = time.monotonic() + 60
while not all(os.path.exists(os.path.join(where, "holding-" + p)) for p in peers):
    if time.monotonic() > deadline:
        sys.exit("a peer never held its devices")
    time.sleep(0.02)
for i in ids:
    os.remove(os.path.join(where, "dev-" + i))
print(os.environ["CUDA_VISIBLE_DEVICES"], end="")
'''

SHOW = "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')), end='')"


def py(name: str, source: str, *args: str, gpu: int = 0) -> ir.Step:
    body = ir.ContainerSpec(image="python:3.12", command=(PY, "-c", source), args=args)
    return ir.Step(name=name, body=body,
                   resources=ir.Resources(gpu=gpu) if gpu else None,
                   outputs=(ir.OutputParameter("seen", ir.OutputSource.STDOUT),))


def outputs(status: object) -> dict[str, str]:
    return {s.step: s.outputs.get("seen", "") for s in status.steps  # type: ignore[attr-defined]
            if s.key == ""}


def test_the_gpu_capability_is_a_rewrite() -> None:
    cap = CAPABILITIES[Feature.GPU]
    assert cap.support is Support.REWRITTEN
    assert "CUDA_VISIBLE_DEVICES" in cap.note and "refused" in cap.note


def test_steps_hold_distinct_devices_and_a_two_gpu_step_gets_both(tmp_path: Path) -> None:
    where = tmp_path / "locks"
    where.mkdir()
    wf = ir.Workflow(name="gpus", steps=(
        py("a", HOLD, str(where), "a", "b", gpu=1),   # a and b hold a device at once
        py("b", HOLD, str(where), "b", "a", gpu=1),
        py("both", HOLD, str(where), "both", gpu=2),
        py("none", SHOW),
    ))
    engine = LocalEngine(tmp_path / "runs", max_workers=4, gpus=["0", "1"])
    status = engine.run(wf)

    assert status.state is RunState.SUCCEEDED, [s.message for s in status.steps]
    seen = outputs(status)
    assert sorted([seen["a"], seen["b"]]) == ["0", "1"]
    assert seen["both"] == "0,1"
    assert seen["none"] == "''"  # a step that asked for no GPU sees none
    assert sorted(p.name for p in where.iterdir()) == ["holding-a", "holding-b",
                                                        "holding-both"]
    assert engine.gpu_pool.acquire(2, threading.Event()) == ("0", "1")  # all given back


def test_the_conformance_gpu_program_runs_with_a_device(tmp_path: Path) -> None:
    wf = load_program(PROGRAMS / "gpu.py")
    uuid = "GPU-8f2c1e7a-0000-4a1b-9c1d-2f7e5a6b8c9d"
    events: list[StepStatus] = []
    run = LocalEngine(tmp_path, gpus=[uuid]).start(wf, on_event=events.append)
    status = run.wait()
    assert status.state is RunState.SUCCEEDED
    assert run.logs("train").strip() == "gpu"
    assert any(e.step == "train" and e.message == f"GPUs {uuid}" for e in events)


@pytest.mark.parametrize(("devices", "asked", "has"), [((), 1, "none"), (("0", "1"), 3, "2")])
def test_a_request_above_the_machine_is_refused_before_anything_runs(
        tmp_path: Path, devices: tuple[str, ...], asked: int, has: str) -> None:
    inner = ir.Workflow(name="inner", steps=(py("fit", SHOW, gpu=asked),))
    wf = ir.Workflow(name="too-many", steps=(
        py("prep", SHOW),
        ir.Step(name="nested", body=ir.SubWorkflowSpec(name="inner", steps=inner.steps)),
    ))
    engine = LocalEngine(tmp_path / "runs", gpus=devices)
    with pytest.raises(InsufficientResourcesError) as err:
        engine.run(wf)
    noun = "GPU" if asked == 1 else "GPUs"
    assert str(err.value).startswith(
        f"workflow 'too-many', step 'nested/fit': requests {asked} {noun}; "
        f"engine 'local' has {has} on this machine")
    assert "COULER_LOCAL_GPUS" in str(err.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_step_waiting_for_a_device_is_cancelled_with_the_run(tmp_path: Path) -> None:
    where = tmp_path / "locks"
    where.mkdir()
    # "first" holds the only device until "never" exists; "second" waits for the device
    wf = ir.Workflow(name="queue", steps=(
        py("first", HOLD, str(where), "first", "never", gpu=1),
        py("second", HOLD, str(where), "second", gpu=1),
    ))
    waiting = threading.Event()

    def seen(e: StepStatus) -> None:
        if e.message.startswith("waiting for 1 of the machine's 1 GPUs"):
            waiting.set()

    engine = LocalEngine(tmp_path / "runs", gpus=["0"])
    run = engine.start(wf, on_event=seen)
    assert waiting.wait(60)
    run.cancel()
    status = run.wait()
    assert status.state is RunState.CANCELLED
    states = {s.step: s.state for s in status.steps if s.key == ""}
    assert set(states.values()) == {StepState.CANCELLED}
    assert engine.gpu_pool.acquire(1, threading.Event()) == ("0",)  # given back


def test_devices_come_from_the_setting_then_cuda_visible_devices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COULER_LOCAL_GPUS", "2,3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert LocalEngine(tmp_path).gpus == ("2", "3")
    monkeypatch.delenv("COULER_LOCAL_GPUS")
    assert LocalEngine(tmp_path).gpus == ("0",)
    monkeypatch.setenv("COULER_LOCAL_GPUS", "none")
    assert LocalEngine(tmp_path).gpus == ()
    monkeypatch.setenv("COULER_LOCAL_GPUS", "0,gpu0")
    with pytest.raises(ValueError, match=r"COULER_LOCAL_GPUS: 'gpu0' is not a GPU index"):
        LocalEngine(tmp_path)


@pytest.mark.parametrize(("visible", "devices"), [
    ("0,1", ("0", "1")), ("", ()), ("-1", ()), ("1,-1,0", ("1",)),
    ("GPU-5c3e0000-aaaa", ("GPU-5c3e0000-aaaa",))])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(visible: str,
                                                       devices: tuple[str, ...]) -> None:
    assert local_gpus.discover({"CUDA_VISIBLE_DEVICES": visible}) == devices


def test_nvidia_smi_lists_the_devices_when_nothing_is_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # nvidia-smi cannot run here (no GPU, no driver): a script stands in for it, printing
    # what `nvidia-smi --query-gpu=index --format=csv,noheader` prints on a 2-GPU machine.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1" = "--query-gpu=index" ] || exit 9\nprintf "0\\n1\\n"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert local_gpus.discover({}) == ("0", "1")
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert local_gpus.discover({}) == ()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert local_gpus.discover({}) == ()
