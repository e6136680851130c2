"""The planner: predicts memory, step time, communication and pipeline bubble of a parallel layout, searches
the layouts of a cluster and explains its choice (``meshlm plan``); docs/planner.md."""
