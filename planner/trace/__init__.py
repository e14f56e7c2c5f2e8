"""Model file -> OpGraph -> blocks: what a model computes, measured on the meta device.

export (torch.export and the saved-tensor pass, or module hooks) -> graph (the OpGraph's
node schema) -> blocks (ops grouped by the module tree, classes of identical blocks); opcost
prices one op's FLOPs; cache keeps traces on disk.
"""
