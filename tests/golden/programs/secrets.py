import couler.argo as couler

couler.config_workflow(name="secrets")
creds = couler.create_secret(secret_data={"USER": "alice", "TOKEN": "s3cr3t-value"}, dry_run=True)
same = couler.create_secret(secret_data={"USER": "alice", "TOKEN": "s3cr3t-value"}, dry_run=True)
couler.run_container(image="alpine:3.20", command=["env"], secret=creds, step_name="first")
couler.run_container(image="alpine:3.20", command=["env"], secret=same, step_name="second")
