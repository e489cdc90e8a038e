"""Hyperparameter tuning: a grid over three values, the best value read by the next step."""
import couler.argo as couler


def trial(x):
    return couler.run_container(
        image="python:3.12-alpine",
        command=["python3", "-c", "import sys; x = int(sys.argv[1]); print(-(x - 2) ** 2)"],
        args=[x],
        step_name="trial",
    )


couler.config_workflow(name="conf-tune")
best = couler.tune(trial, space={"x": couler.choice(1, 2, 3)}, trials=3, parallel=2,
                   objective="result", sampler="grid", seed=0)
couler.run_container(image="python:3.12-alpine",
                     command=["python3", "-c", "import sys; print(sys.argv[1])"],
                     args=[best["x"]], step_name="use")
