import couler.argo as couler

with couler.workflow("workflow-parameters") as wf:
    dataset = couler.workflow_parameter("dataset", default="s3://data/train.csv")
    epochs = couler.workflow_parameter("epochs", default=10)
    couler.run_container(
        image="python:3.12-slim",
        command=["python", "-m", "train"],
        args=[dataset, epochs],
        step_name="train",
    )
    couler.run()
