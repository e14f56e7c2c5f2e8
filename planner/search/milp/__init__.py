"""The stage MILP of one candidate: its data (``data.StageProblem``), built from the cost
model's terms (``candidate``), its HiGHS rows (``rows``), its solve with the formulation in
the docstring (``solve``), and the LP relaxation the search's bounds solve (``relaxation``)."""
