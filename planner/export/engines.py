"""The engines a plan exports to (``--export``, ``plan export``) and the schedulers it
writes launch files for (``plan run --emit``)."""

ENGINES = ("torchtitan", "megatron", "deepspeed", "accelerate")
SCHEDULERS = ("slurm", "kubernetes", "skypilot")
DEFAULT_IMAGE = "meshplan:latest"  # --emit kubernetes without --image
