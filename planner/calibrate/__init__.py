"""``plan calibrate``: measure this machine and write a device profile.

command (the CLI and the orchestration) -> workers (processes that measure) -> bench (the
measurements) -> fit (alpha-beta and rate fits) -> profile (the profile built from them);
display shows progress and the summary.
"""

from planner.calibrate.command import main

__all__ = ["main"]
