"""``meshlm demo``: the whole workflow on the embedded default, offline, in a few minutes on two CPU cores.

pretrain -> SFT -> DPO -> the safety table before and after (``meshlm align`` sized down for the demo) -> registry
-> ``meshlm serve`` -> one request through the official ``openai`` client -> ``meshlm audit verify`` -> plots and
the next commands to try on a real model. :mod:`meshlm.demo.stages` runs the stages through the same functions and
commands a user runs; :mod:`meshlm.demo.summary` writes what the demo prints about them.
"""
