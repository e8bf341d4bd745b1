"""draftyard control plane: HTTP API, DB models, services, scheduler policy, CLI.
Never imports torch or workers/."""
