"""A map over static items with a parallelism bound."""
import couler.argo as couler


def square(n):
    return couler.run_container(
        image="python:3.12-alpine",
        command=["python3", "-c",
                 "import sys; open('/tmp/sq.txt', 'w').write(str(int(sys.argv[1]) ** 2))"],
        args=[n],
        output=couler.create_parameter_artifact(path="/tmp/sq.txt", name="square"),
        step_name="square",
    )


couler.config_workflow(name="conf-map-static")
couler.map(square, [1, 2, 3], parallelism=2)
