"""Train one model per batch size with `map`, then fan out over an upstream list."""

import couler.argo as couler
from couler.argo_submitter import ArgoSubmitter


def train(batch_size):
    return couler.run_container(
        image="python:3.12-slim",
        command=["python", "-c"],
        args=["import sys; print('training with batch size', sys.argv[1])", batch_size],
        step_name="train",
    )


def list_shards():
    import json

    print(json.dumps(["shard-0", "shard-1", "shard-2"]))


def score(shard):
    return couler.run_container(
        image="alpine:3.20", command=["echo"], args=[shard], step_name="score"
    )


couler.config_workflow(name="map-batches")
couler.map(lambda size: train(size), [16, 32, 64, 128])
shards = couler.run_script(image="python:3.12-alpine", source=list_shards, step_name="shards")
couler.map(lambda shard: score(shard), shards, parallelism=2)

if __name__ == "__main__":
    couler.run(submitter=ArgoSubmitter())
