"""A map over a JSON list produced by an upstream script."""
import couler.argo as couler


def shards():
    import json

    print(json.dumps(["a", "b", "c"]))


def process(shard):
    done = couler.create_parameter_artifact(path="/tmp/done.txt", name="done")
    return couler.run_container(image="alpine:3.20",
                                command=["sh", "-c", 'echo "shard-$0" > /tmp/done.txt'],
                                args=[shard], output=done, step_name="process")


couler.config_workflow(name="conf-map-upstream")
listing = couler.run_script(image="python:3.12-alpine", source=shards, step_name="list-shards")
couler.map(process, listing)
