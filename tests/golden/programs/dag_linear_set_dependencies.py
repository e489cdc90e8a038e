# The same graph as dag_linear.py, written with set_dependencies: the output must be identical.
import couler.argo as couler


def job(name):
    couler.run_container(image="alpine:3.20", command=["echo"], args=[name], step_name=name)


couler.config_workflow(name="dag-linear")
couler.set_dependencies(lambda: job("a"), dependencies=None)
couler.set_dependencies(lambda: job("b"), dependencies=["a"])
couler.set_dependencies(lambda: job("c"), dependencies=["a"])
couler.set_dependencies(lambda: job("d"), dependencies=["b"])
