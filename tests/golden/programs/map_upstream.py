import couler.argo as couler


def shards():
    import json

    print(json.dumps(["a", "b", "c"]))


def process(shard):
    return couler.run_container(
        image="alpine:3.20", command=["echo"], args=[shard], step_name="process"
    )


couler.config_workflow(name="map-upstream")
listing = couler.run_script(image="python:3.12-alpine", source=shards, step_name="list-shards")
couler.map(lambda shard: process(shard), listing)
