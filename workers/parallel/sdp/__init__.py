"""Subnetwork Data Parallelism: each worker trains a structurally complete subnetwork.

masks.py      which worker holds which blocks / hidden units (deterministic, balanced, connected)
subnetwork.py the rank's model: masked components dropped (forward) or frozen (backward)
sync.py       averaging every shared piece among exactly its holders, one group per holder set
"""
