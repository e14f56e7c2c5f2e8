"""The solver: the outer search space (candidates), each block's priced options (options),
bounds that prune candidates without a MILP (bounds), one candidate's stage MILP (problem,
stage_milp), and the search that ties them together (driver)."""

from planner.search.candidates import Candidate, Pins
from planner.search.driver import SearchResult, search

__all__ = ["Candidate", "Pins", "SearchResult", "search"]
