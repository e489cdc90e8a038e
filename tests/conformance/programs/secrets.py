"""A secret reference resolved into a step's environment."""
import couler.argo as couler

couler.config_workflow(name="conf-secrets")
creds = couler.obtain_secret(secret_keys=["TOKEN"], name="conformance-creds")
couler.run_container(
    image="alpine:3.20",
    command=["sh", "-c", 'test "$TOKEN" = s3cr3t && echo token-ok > /tmp/check.txt'],
    output=couler.create_parameter_artifact(path="/tmp/check.txt", name="check"),
    secret=creds,
    step_name="use-secret",
)
