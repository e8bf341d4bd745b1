"""The typed contracts shared by the control plane and the stages: each job type's params and
inputs models and its definition (contracts/jobtypes.py), the run body (contracts/run.py),
the stage spec (contracts/spec.py). `POST /v1/jobs` and `POST /v1/runs` answer 422 naming the
field before anything is queued; the stages validate again (each runs alone from a shell too).

Imports nothing but pydantic: `app/` may use it without pulling in the pipeline core.
"""
