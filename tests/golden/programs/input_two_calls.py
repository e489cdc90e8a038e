import couler.argo as couler


def say(message):
    return couler.run_container(image="alpine:3.20", command=["echo"], args=[message])


couler.config_workflow(name="input-two-calls")
say("hello")
say("goodbye")
