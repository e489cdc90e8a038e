"""A step that requests a GPU."""
import couler.argo as couler

couler.config_workflow(name="conf-gpu")
couler.run_container(image="python:3.12-alpine", command=["python3", "-c", "print('gpu')"],
                     resources={"cpu": "1", "memory": "1Gi", "gpu": 1}, step_name="train")
