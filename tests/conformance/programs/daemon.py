"""A daemon step (a server other steps talk to)."""
import couler.argo as couler

couler.config_workflow(name="conf-daemon")
couler.run_container(image="alpine:3.20", command=["sh", "-c", "sleep 1"], step_name="server",
                     daemon=True)
