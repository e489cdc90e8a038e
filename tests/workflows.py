"""Small workflows several test modules run (one definition each)."""

from __future__ import annotations

from couler import ir

__all__ = ["make_and_use"]


def make_and_use(name: str, prelude: str = "", image: str = "python:3.12") -> ir.Workflow:
    """``make`` runs ``prelude``, writes the artifact ``data`` ("fresh") and prints ``new``
    (output ``said``); ``use`` prints the artifact and ``said`` (output ``seen``)."""
    make = ir.Step(
        name="make", body=ir.ScriptSpec(image=image, source=(
            f"{prelude}\nimport pathlib\npathlib.Path('/tmp/out/data.txt').write_text('fresh')"
            "\nprint('new')")),
        outputs=(ir.OutputParameter("said", source=ir.OutputSource.STDOUT),),
        output_artifacts=(ir.OutputArtifact("data", "/tmp/out/data.txt"),))
    use = ir.Step(
        name="use", body=ir.ContainerSpec(image="alpine", command=(
            "sh", "-c", "cat /tmp/in/data.txt; echo \" {{inputs.x}}\"")),
        inputs=(ir.InputParameter("x", ir.StepOutputRef("make", "said")),),
        input_artifacts=(ir.InputArtifact("data", "/tmp/in/data.txt",
                                          ir.StepArtifactRef("make", "data")),),
        outputs=(ir.OutputParameter("seen", source=ir.OutputSource.STDOUT),),
        dependencies=(ir.Dependency("make"),))
    return ir.Workflow(name=name, steps=(make, use))
