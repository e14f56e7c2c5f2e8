"""The cost model: what one block option, one stage and one step cost in time and memory
(model), and the tensor-parallel variants of a block found by an intra-block ILP (sharding)."""
