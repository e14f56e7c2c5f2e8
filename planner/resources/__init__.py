"""Resource pools: choose which kind of node, and how many, a training run should use.

A pool file lists the node types on offer with their price, power and grid; the planner's own
search prices each (kind, count) option, and this package turns step times into the time, money,
energy and carbon of the whole run, then picks by the objective under a deadline and a budget.
It sits above ``planner.api`` (it calls ``plan``) and below the CLI.
"""
