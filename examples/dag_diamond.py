"""The diamond DAG: A feeds B and C, which both feed D."""

import couler.argo as couler
from couler.argo_submitter import ArgoSubmitter


def job(name):
    couler.run_container(
        image="docker/whalesay:latest", command=["cowsay"], args=[name], step_name=name
    )


couler.config_workflow(name="dag-diamond")
couler.dag(
    [
        [lambda: job("A")],
        [lambda: job("A"), lambda: job("B")],  # A -> B
        [lambda: job("A"), lambda: job("C")],  # A -> C
        [lambda: job("B"), lambda: job("D")],  # B -> D
        [lambda: job("C"), lambda: job("D")],  # C -> D
    ]
)

if __name__ == "__main__":
    couler.run(submitter=ArgoSubmitter())
