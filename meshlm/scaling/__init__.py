"""Scaling laws: sweeps of model sizes x token budgets (``meshlm sweep``) and fits of L(N, D) with the
compute-optimal allocation (``meshlm scaling fit``). docs/scaling.md explains both."""
