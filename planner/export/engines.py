"""The engines a plan exports to (the values ``--export`` and ``plan export`` take)."""

ENGINES = ("torchtitan", "megatron", "deepspeed", "accelerate")
