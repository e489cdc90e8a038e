import couler.argo as couler


def job(name):
    couler.run_container(image="alpine:3.20", command=["echo"], args=[name], step_name=name)


couler.config_workflow(name="dag-linear")
couler.dag(
    [
        [lambda: job("a")],
        [lambda: job("a"), lambda: job("b")],
        [lambda: job("a"), lambda: job("c")],
        [lambda: job("b"), lambda: job("d")],
    ]
)
