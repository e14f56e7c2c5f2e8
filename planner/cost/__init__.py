"""The cost model, by subject: ``records`` (what is priced and what it costs), ``compute``,
``block_options`` (a block's priced options), ``data_parallel``, ``pipeline``, ``memory``,
``optimizer`` (and offload), and ``step`` (a configuration's step time and memory, what the
solver optimizes); ``sharding`` is the intra-block ILP that finds a block's tensor-parallel
variants and ``eager_probe`` checks them against the model's own Python."""
