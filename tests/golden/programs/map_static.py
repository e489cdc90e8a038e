import couler.argo as couler


def train(lr, batch):
    return couler.run_container(
        image="python:3.12-slim",
        command=["python", "-m", "train"],
        args=[lr, batch],
        step_name="train",
    )


couler.config_workflow(name="map-static")
couler.map(lambda lr, batch: train(lr, batch), [0.1, 0.01, 0.001], [32, 64, 128], parallelism=2)
