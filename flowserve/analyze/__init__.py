"""``flowserve analyze``: tune a graph or model against a p99 target.

Starts its own server (explicit model control, free ports on 127.0.0.1), applies each
candidate configuration through the load API (a restart only for ``--workers``), measures it
with ``flowserve bench`` at rising concurrency and reads the per-node statistics to choose the
next step (the bottleneck node first). A top-level tool like the CLI: the server never imports
it. Layout: space (knobs and steps), search (pure), target (files and names), textedit (edits
that keep a file's comments), server, measure, report, run.
"""

from flowserve.analyze.run import AnalyzeOptions, analyze, search
from flowserve.analyze.search import Goal, Point, Trial

__all__ = ["AnalyzeOptions", "Goal", "Point", "Trial", "analyze", "search"]
