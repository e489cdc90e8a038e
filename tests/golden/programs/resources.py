import couler.argo as couler


def train():
    return couler.run_container(
        image="python:3.12-slim",
        command=["python", "-c", "print('train')"],
        resources={"cpu": "2", "memory": "4Gi", "gpu": 1},
        step_name="train",
    )


couler.config_workflow(name="resources")
train()
