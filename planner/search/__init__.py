"""The solver: the outer search space (candidates), each block's priced options (options),
bounds that prune candidates without a MILP (bounds), one candidate's stage MILP (milp/), the
search that ties them together (driver), and the search over a pool of device kinds
(mixed/)."""

from planner.search.candidates import Candidate, Pins
from planner.search.driver import SearchResult, search

__all__ = ["Candidate", "Pins", "SearchResult", "search"]
