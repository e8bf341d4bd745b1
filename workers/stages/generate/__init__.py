"""The `generate` stage (see stage.py): regenerate assistant turns with the target model,
through vLLM on GPUs or transformers anywhere."""

from workers.stages.generate.stage import run

__all__ = ["run"]
