"""The troubleshooting doctor: ``meshlm diagnose oom | slow | parity`` (docs/troubleshooting.md)."""
