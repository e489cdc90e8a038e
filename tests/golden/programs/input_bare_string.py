import couler.argo as couler


def outer():
    def shout(text):
        return couler.run_container(image="alpine:3.20", command=["echo"], args=text)

    shout("a bare string argument")


couler.config_workflow(name="input-bare-string")
outer()
