"""torchchaos engine: scenario -> schedule -> runner -> history -> checkers -> report.

Kept free of heavy imports: the agent imports this package inside every rank.
"""

__version__ = "0.1.0"
