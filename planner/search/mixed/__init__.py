"""The search over a pool of device kinds: pipelines whose stages run on kinds, TP and DP
degrees of their own (``search``), their MILP (``milp``), its bounds (``bound``) and the
step time of a placement, the MILP's objective checked by brute force (``cost``)."""
